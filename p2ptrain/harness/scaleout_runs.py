"""The names of `bench scaleout`'s runs, in their order: one light module, so that the CLI can
offer them without importing the bench (harness/scaleout_bench.py says what each one is)."""

RUN_ORDER = (
    "step",
    "diloco",
    "diloco_fp16",
    "diloco_outer_int8",
    "diloco_int8",
    "diloco_fedavg",
)
