"""`p2ptrain bench scaleout`: does every volunteer add speed? The same model, data and emulated
WAN as `bench e2e` (its testbed, CPU quotas and shipped path: a bootstrap and `join` nodes,
the live compute-aware planner; harness/e2e_join.py), trained once per data-parallel mode:

- step: every-step averaging (today's default run spec);
- diloco: the recommended diloco settings (harness/scaleout_runs.py, docs/operations.md): each
  pipeline a replica with `batch_size` rows of its own, H 30 inner steps, then each stage
  group's outer round (block-wise int8 pseudo-gradients, outer lr 1.0, Nesterov momentum 0.5)
  in 2 fragments, staggered by H/2 (Streaming DiLoCo: half the stage's bytes a round);
- diloco_fp16: diloco with fp16 pseudo-gradients (2 bytes a value);
- diloco_f1: diloco with the whole stage in one round every H steps (one fragment);
- diloco_topk: diloco with top-k 3% pseudo-gradients at 2 bits and error feedback, at H 5;
- diloco_paper: diloco with DiLoCo's outer step (lr 0.7, Nesterov momentum 0.9);
- diloco_int8: diloco with int8 pipeline activations and their gradients (per-row scaled);
- diloco_fedavg: diloco with FedAvg's outer step (outer lr 1.0, no momentum);
- diloco_hN: diloco with H = N inner steps.

Per run: tokens/s, the placed peers and plan, the loss per step, data-parallel bytes per step
as the workers counted them on the links between members of a stage group, what every-step
fp16 averaging of the same plan would move there, the simulated step against the workers'
median step, and the longest step against the median one.

Time to target (issue 28's contract): the target is `step`'s final loss; a run reaches it at the
first step whose loss is at most the target, in seconds since the workers reported the first
plan. A step's loss is one batch's (under diloco each replica's own model between rounds), so
the JSON also has the same on smoothed losses (`target_loss_smoothed`, each run's
`time_to_smoothed_target_s`): the mean of the last SMOOTH_STEPS steps' losses (fewer at the
start), which one lucky batch does not move.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from p2ptrain.harness.e2e_bench import guarded
from p2ptrain.harness.e2e_join import train_join
from p2ptrain.harness.e2e_traffic import dp_bytes, predicted_link_bytes
from p2ptrain.harness.scaleout_runs import (
    INNER_STEPS,
    OUTER_COMPRESSION,
    OUTER_FRAGMENTS,
    OUTER_LR,
    OUTER_MOMENTUM,
    RUN_ORDER,
    TOPK_INNER_STEPS,
)
from p2ptrain.records.run import RunSpec
from p2ptrain.schedule.workload import step_traffic, tokens_per_step
from p2ptrain.testbed.testbed import Testbed

SMOOTH_STEPS = 5
SETTINGS = (
    "sync",
    "batch_size",
    "inner_steps",
    "outer_lr",
    "outer_momentum",
    "outer_compression",
    "outer_fragments",
    "compression",
)


def run_specs(
    spec: RunSpec, runs: Sequence[str], inner_steps: int = INNER_STEPS
) -> dict[str, RunSpec]:
    """The run spec of each named run, from the base run spec: those of RUN_ORDER, and
    `diloco_hN`, diloco with H = N (a longer H: fewer bytes a step)."""
    diloco = spec.replace(
        sync="diloco",
        inner_steps=inner_steps,
        outer_lr=OUTER_LR,
        outer_momentum=OUTER_MOMENTUM,
        outer_compression=OUTER_COMPRESSION,
        outer_fragments=OUTER_FRAGMENTS,
    )
    every = {
        "step": spec.replace(sync="step"),
        "diloco": diloco,
        "diloco_fp16": diloco.replace(outer_compression="fp16"),
        # the whole stage in one round, not staggered fragments
        "diloco_f1": diloco.replace(outer_fragments=1),
        "diloco_topk": diloco.replace(outer_compression="topk", inner_steps=TOPK_INNER_STEPS),
        "diloco_paper": diloco.replace(outer_lr=0.7, outer_momentum=0.9),
        "diloco_int8": diloco.replace(compression="int8"),
        # FedAvg's outer step: the replicas' mean, no momentum
        "diloco_fedavg": diloco.replace(outer_lr=1.0, outer_momentum=0.0),
    }
    for name in runs:
        other_h = re.fullmatch(r"diloco_h([1-9][0-9]{0,4})", name)
        if other_h:
            every[name] = diloco.replace(inner_steps=int(other_h.group(1)))
    unknown = set(runs) - set(every)
    if unknown:
        raise ValueError(
            f"unknown runs {sorted(unknown)}; known: {', '.join(RUN_ORDER)}, diloco_hN"
        )
    return {name: every[name] for name in every if name in runs}


def run_scaleout_bench(
    topology: Any,
    specs: dict[str, RunSpec],
    *,
    bandwidth_scale: float | None,
    delay_scale: float,
    seed: int,
    progress: Callable[[str], None],
    log_dir: Path | None = None,
    compute_cores: dict[int, float] | None = None,
) -> dict[str, Any]:
    """Train each run one after the other on one testbed; the bench's JSON."""
    raw: dict[str, dict[str, Any]] = {}
    with Testbed.from_topology(
        topology,
        bandwidth_scale=bandwidth_scale,
        delay_scale=delay_scale,
        compute_cores=compute_cores,
    ) as bed:
        for name, spec in specs.items():
            run = partial(train_join, bed, spec, "scheduled", seed, progress, log_dir, name)
            raw[name] = guarded(name, run, progress)
    return assemble(raw, specs)


def smoothed(losses: Sequence[float], window: int = SMOOTH_STEPS) -> list[float]:
    """Each step's trailing mean over the last `window` losses (fewer at the start)."""
    return [statistics.fmean(losses[max(0, i + 1 - window) : i + 1]) for i in range(len(losses))]


def time_to_target(
    seconds: Sequence[float], losses: Sequence[float], target: float | None
) -> float | None:
    """Seconds at the first step whose loss is at most `target`; None if never."""
    if target is None:
        return None
    return next((t for t, loss in zip(seconds, losses, strict=True) if loss <= target), None)


def every_step_dp_bytes(
    spec: RunSpec, pipelines: Sequence[Sequence[int]], layers: Sequence[int] | None
) -> float:
    """Bytes per step every-step fp16 averaging of this plan moves between the members of its
    stage groups (the traffic model bench e2e predicts link bytes with; 0 with one replica)."""
    fp16 = spec.replace(sync="step", compression="fp16")
    traffic = step_traffic(fp16, len(pipelines[0]), len(pipelines), layers or None)
    links = predicted_link_bytes(
        pipelines, traffic.stage_gradient_bytes, [0.0] * len(pipelines), 0.0
    )
    return dp_bytes(links, pipelines)


def _step_spread(steps_s: Sequence[float]) -> dict[str, float | None]:
    """The longest step against the median one, the first step (warm-up) and the last left
    out: the last one closes the run (under diloco its outer round is applied at once, after
    every replica's last step: a wait for the slowest replica, not a step's), reported apart
    as `final_step_s`."""
    steady = list(steps_s[1:-1]) or list(steps_s)
    final = steps_s[-1] if steps_s else None
    if not steady:
        return {
            "step_max_s": None,
            "step_median_s": None,
            "step_max_over_median": None,
            "final_step_s": final,
        }
    median = statistics.median(steady)
    return {
        "step_max_s": max(steady),
        "step_median_s": median,
        "step_max_over_median": max(steady) / median if median > 0 else None,
        "final_step_s": final,
    }


def describe(name: str, raw: dict[str, Any], spec: RunSpec) -> dict[str, Any]:
    """One run's entry of the JSON (the contract's keys first, then what the table uses)."""
    flat = spec.to_flat_dict()
    settings = {key: flat[key] for key in SETTINGS}
    if "curve" not in raw:
        return {
            "tokens_per_s": None,
            "time_to_target_s": None,
            "dp_bytes_per_step": None,
            "dp_bytes_per_step_every_step": None,
            "placed_peers": 0,
            "plan": None,
            "loss": [],
            "predicted_step_s": None,
            "worker_step_s": None,
            "error": raw.get("error", "no steps"),
            "settings": settings,
        }
    pipelines = raw["pipelines"]
    seconds = [t for t, _ in raw["curve"]]
    losses = [loss for _, loss in raw["curve"]]
    # tokens a step as each step's plan trained them (a re-plan may change the replicas)
    per_step = raw.get("step_tokens") or [tokens_per_step(spec, len(pipelines))] * len(losses)
    predicted, worker = raw.get("predicted_step_s"), raw.get("worker_step_s")
    return {
        "tokens_per_s": raw["tokens_per_s"],
        "time_to_target_s": None,  # assemble() sets it once the target is known
        "dp_bytes_per_step": raw.get("dp_bytes_per_step"),
        "dp_bytes_per_step_every_step": every_step_dp_bytes(
            spec, pipelines, raw.get("stage_layers")
        ),
        "placed_peers": sum(len(pipe) for pipe in pipelines),
        "plan": {
            "shape": f"{len(pipelines)} x {len(pipelines[0])}",
            "pipelines": pipelines,
            "stage_layers": raw.get("stage_layers"),
            "term": raw.get("term"),
            "epoch": raw.get("epoch"),
            "plans": raw.get("plans"),
        },
        "loss": losses,
        "predicted_step_s": predicted,
        "worker_step_s": worker,
        "seconds": seconds,
        "tokens": list(itertools.accumulate(per_step)),
        "predicted_dp_bytes_per_step": raw.get("predicted_dp_bytes_per_step"),
        "step_model_error": predicted / worker - 1 if predicted and worker else None,
        **_step_spread(raw.get("worker_steps_s", [])),
        "settings": settings,
    }


def assemble(raw: dict[str, dict[str, Any]], specs: dict[str, RunSpec]) -> dict[str, Any]:
    """The bench's JSON from each run's bench-e2e-style dict: the runs, the target (`step`'s
    final loss; and smoothed) and each run's time to it; every other run's ratios against step."""
    runs = {name: describe(name, raw[name], specs[name]) for name in raw}
    step = runs.get("step", {})
    target = step["loss"][-1] if step.get("loss") else None
    target_smoothed = smoothed(step["loss"])[-1] if step.get("loss") else None
    for run in runs.values():
        if run["loss"]:
            run["time_to_target_s"] = time_to_target(run["seconds"], run["loss"], target)
            run["time_to_smoothed_target_s"] = time_to_target(
                run["seconds"], smoothed(run["loss"]), target_smoothed
            )
    for name, run in runs.items():
        if name != "step" and step:
            run["vs_step"] = versus(run, step)
    return {"runs": runs, "target_loss": target, "target_loss_smoothed": target_smoothed}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def versus(run: dict[str, Any], step: dict[str, Any]) -> dict[str, float | None]:
    """A run against `step`: tokens/s ×, time to target × shorter, DP bytes × fewer than
    every-step fp16 averaging of its own plan."""
    return {
        "tokens_per_s": _ratio(run["tokens_per_s"], step["tokens_per_s"]),
        "time_to_target_shorter": _ratio(step["time_to_target_s"], run["time_to_target_s"]),
        "time_to_smoothed_target_shorter": _ratio(
            step.get("time_to_smoothed_target_s"), run.get("time_to_smoothed_target_s")
        ),
        "dp_bytes_fewer": _ratio(run["dp_bytes_per_step_every_step"], run["dp_bytes_per_step"]),
    }


def acceptance(
    result: dict[str, Any], num_peers: int, name: str = "diloco"
) -> list[tuple[str, bool | None]]:
    """Issue 28's bars for run `name` against step on a network of `num_peers` peers: (what,
    met; None = not measured)."""
    runs = result["runs"]
    run, step = runs.get(name), runs.get("step")
    if run is None or step is None or run.get("error") or step.get("error"):
        return [(f"{name} and step both ran", False)]
    vs = run.get("vs_step", {})

    def at_least(value: float | None, bar: float) -> bool | None:
        return None if value is None else value >= bar

    def within(err: float | None) -> bool | None:
        return None if err is None else abs(err) <= 0.10

    return [
        (f"places all {num_peers} peers", run["placed_peers"] == num_peers),
        ("tokens/s >= 1.8x step", at_least(vs.get("tokens_per_s"), 1.8)),
        ("time to target >= 1.4x shorter", at_least(vs.get("time_to_target_shorter"), 1.4)),
        ("DP bytes/step >= 50x fewer than every-step fp16", at_least(vs.get("dp_bytes_fewer"), 50)),
        (
            "no step > 1.5x median step",
            None if run["step_max_over_median"] is None else run["step_max_over_median"] <= 1.5,
        ),
        (f"step model within 10% ({name})", within(run["step_model_error"])),
        ("step model within 10% (step)", within(step["step_model_error"])),
    ]


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def render(result: dict[str, Any], num_peers: int) -> str:
    """The table: per run its plan, tokens/s, time to target, DP bytes, step model and spread;
    then each run against step and issue 28's bars for the diloco runs."""
    target = result["target_loss"]
    lines = [
        f"{'run':<12} {'plan':>6} {'peers':>5} {'tokens/s':>8} {'to ' + _fmt(target, '.3f'):>9} "
        f"{'DP B/step':>10} {'every-step':>10} {'pred s':>6} {'worker s':>8} {'err':>5} "
        f"{'max/med':>7}"
    ]
    for name, r in result["runs"].items():
        if r.get("error"):
            lines.append(f"{name:<12} failed: {r['error']}")
            continue
        lines.append(
            f"{name:<12} {r['plan']['shape'].replace(' ', ''):>6} {r['placed_peers']:>5} "
            f"{r['tokens_per_s']:>8.0f} {_fmt(r['time_to_target_s'], '.1f', ' s'):>9} "
            f"{_fmt(r['dp_bytes_per_step'], '.3g'):>10} "
            f"{_fmt(r['dp_bytes_per_step_every_step'], '.3g'):>10} "
            f"{_fmt(r['predicted_step_s'], '.2f'):>6} {_fmt(r['worker_step_s'], '.2f'):>8} "
            f"{_fmt(r['step_model_error'], '+.0%'):>5} {_fmt(r['step_max_over_median'], '.2f'):>7}"
        )
    for name, r in result["runs"].items():
        vs = r.get("vs_step")
        if vs:
            lines.append(
                f"{name} / step: tokens/s {_fmt(vs['tokens_per_s'], '.2f', 'x')}, time to "
                f"target {_fmt(vs['time_to_target_shorter'], '.2f', 'x')} shorter (smoothed "
                f"{_fmt(vs.get('time_to_smoothed_target_shorter'), '.2f', 'x')}), DP bytes "
                f"{_fmt(vs['dp_bytes_fewer'], '.0f', 'x')} fewer than every-step fp16"
            )
    for name in (n for n in result["runs"] if n.startswith("diloco")):
        marks = {True: "met", False: "NOT met", None: "not measured"}
        bars = "; ".join(f"{what}: {marks[ok]}" for what, ok in acceptance(result, num_peers, name))
        lines.append(f"{name} acceptance: {bars}")
    return "\n".join(lines)
