"""The names of `bench scaleout`'s runs, in their order, and the recommended diloco settings
its `diloco` run (and `bench convergence`'s diloco variants) train with: one light module, so
that the CLI can offer them without importing the benches (harness/scaleout_bench.py says what
each run is)."""

RUN_ORDER = (
    "step",
    "diloco",
    "diloco_fp16",
    "diloco_f1",
    "diloco_topk",
    "diloco_paper",
    "diloco_int8",
    "diloco_fedavg",
)

# The recommended diloco settings on runs of tens to hundreds of steps (docs/operations.md),
# measured by bench convergence's short runs (2026-11-26, docs/benchmarks.md):
# - H 30 with int8 rounds: 59x fewer data-parallel bytes a step than every-step fp16 averaging
#   (1.016 bytes a value, a round every 30 steps); the loss at H 10, 30 differed by < 1%;
# - outer lr 1.0, momentum 0.5: DiLoCo's 0.7 / Nesterov 0.9 are tuned for hundreds of rounds;
#   a run of 80 steps has three, and the last one, applied at once, overshot (+3% loss);
# - top-k 3% (0.055 bytes a value) needs many rounds (each changes at most 3% of the entries;
#   the rest waits in error feedback): at H 30 it lost 9% of loss at 300 steps, at H 5 it is
#   within 1% of fp16 rounds at H 30 while moving a third of H 30 int8's bytes a step.
# - 2 fragments (Streaming DiLoCo, 2026-11-29): at H 30 a round's result is due 15 steps after
#   it starts, so with two halves staggered by 15 steps a replica always has one half-sized
#   round running, not a whole one half the time: the round's cost to a step is halved at its
#   peak, and the loss is unchanged (bench convergence, H 30 int8: 2.1280 against 2.1306).
INNER_STEPS = 30
TOPK_INNER_STEPS = 5
OUTER_LR = 1.0
OUTER_MOMENTUM = 0.5
OUTER_COMPRESSION = "int8"
OUTER_FRAGMENTS = 2
