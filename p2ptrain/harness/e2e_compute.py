"""What the stages of a `bench e2e` run computed, from the workers' metrics logs, for the
step-time simulation (schedule/step_sim.py's simulated_step_s).

Each worker's metrics of a step carry `forward_s`, `backward_s` (its stage's forward and
backward passes over all micro-batches, waits for frames left out) and `update_s` (clipping
and the optimizer step); `averaging_s` is the wall time of the step's averaging round. The
bench starts its workers with `--profile`: each step's StepProfile adds where its CPU went (the
worker thread's in the passes and update, the process tree's in the round and beside the
frames). The median over the plan's steps (the first one left out: it warms up) is what the
stage takes. These are measurements of the run itself, not fitted to its step time: the
simulation adds the links (delay, rate) and the schedule (bubbles, overlap, averaging) on top.
Logs are read as records (harness/worker_logs.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from p2ptrain.harness.worker_logs import ProfiledStep, read_steps
from p2ptrain.records import StepProfile
from p2ptrain.schedule.step_sim import MeasuredCompute
from p2ptrain.testbed import cpu

COMPUTE_FIELDS = ("forward_s", "backward_s", "update_s")
# the worker thread's CPU seconds in the same pieces (a profiling worker's StepProfile)
CPU_FIELDS = ("forward_cpu_s", "backward_cpu_s", "update_cpu_s")


def stage_medians(logs: Sequence[Path], plan_key: tuple[int, int]) -> list[dict[str, float] | None]:
    """Per worker (in the order of `logs`): the median of each timing field over its steps
    under the plan, the first step left out; None for a worker without them (a spare, or a
    worker that does not time its stage)."""
    result: list[dict[str, float] | None] = []
    for path in logs:
        mine = [
            s
            for s in read_steps(path, plan_key)
            if all(getattr(s.metrics, k) is not None for k in COMPUTE_FIELDS)
        ]
        steady = mine[1:] or mine
        if not steady:
            result.append(None)
            continue
        medians: dict[str, float] = {}
        _add_median(medians, "step_s", (s.metrics.step_s for s in steady))
        for key in (*COMPUTE_FIELDS, "averaging_s"):
            _add_median(medians, key, (getattr(s.metrics, key) for s in steady))
        profiles = [s.profile for s in steady if s.profile is not None]
        for key in ("averaging_cpu_s", *CPU_FIELDS):
            _add_median(medians, key, (getattr(p, key) for p in profiles))
        medians.update(_round_cpu_shares(profiles))
        medians.update(_passes_cpu(steady))
        result.append(medians)
    return result


def _add_median(to: dict[str, float], key: str, values: Iterable[float | None]) -> None:
    known = [v for v in values if v is not None]
    if known:
        to[key] = statistics.median(known)


def _passes_cpu(steps: Sequence[ProfiledStep]) -> dict[str, float]:
    """The frames' CPU per frame and the helper processes' CPU rate during the passes (cores),
    as ratios of sums like the round's shares below; {} where not profiled."""
    profiled = [(s.metrics, s.profile) for s in steps if s.profile is not None]
    framed = [(p.frames_cpu_s, p.frames) for _, p in profiled if p.frames_cpu_s is not None]
    result = {}
    if sum(n for _, n in framed) > 0:
        result["frame_cpu_s"] = sum(cpu for cpu, _ in framed) / sum(n for _, n in framed)
    # the passes' wall time: the step less its round and its update (session.py's pieces)
    helped = [
        (p.helpers_cpu_s, m.step_s - m.averaging_s - m.update_s)
        for m, p in profiled
        if p.helpers_cpu_s is not None and m.averaging_s is not None and m.update_s is not None
    ]
    if sum(wall for _, wall in helped) > 0:
        result["helpers_cores"] = sum(cpu for cpu, _ in helped) / sum(w for _, w in helped)
    return result


def _round_cpu_shares(profiles: Sequence[StepProfile]) -> dict[str, float]:
    """The shares of the round's CPU spent before its first part left and after its last part
    arrived, over the profiles that split it: as sums, not medians, since the process tree's
    clock ticks in 10 ms, a fair share of a round's CPU here (a sum's rounding errors cancel
    out, a median's do not); {} if none split it."""
    split = [
        (p.averaging_cpu_s, p.averaging_cpu_before_s, p.averaging_cpu_after_s)
        for p in profiles
        if p.averaging_cpu_s is not None
        and p.averaging_cpu_before_s is not None
        and p.averaging_cpu_after_s is not None
    ]
    total = sum(spent for spent, _, _ in split)
    if total <= 0:
        return {}
    return {
        "averaging_before_share": sum(before for _, before, _ in split) / total,
        "averaging_after_share": sum(after for _, _, after in split) / total,
    }


def measured_compute(
    logs: Sequence[Path],
    plan_key: tuple[int, int],
    pipelines: Sequence[Sequence[int]],
    micro_batches: int,
    cores: Mapping[int, float] | None = None,
) -> MeasuredCompute | None:
    """The (replica, stage) grid of what each stage's machine did per micro-batch (forward,
    backward), per update, per averaging round and per frame, for pipelines of peer indices
    (index i: logs[i]); None if a stage was not timed. The passes and the update are the worker
    thread's CPU seconds where it reported them (else their wall time); the round and the frames
    the CPU seconds its process tree spent in them. With `cores` (peer index -> the CPU quota
    its worker ran under), each stage's machine runs that quota with the testbed's period
    (testbed/cpu.py), as the kernel ran it."""
    medians = stage_medians(logs, plan_key)
    keys = (
        "forward",
        "backward",
        "update",
        "local",
        "frame",
        "cores",
        "period",
        "before",
        "after",
        "helpers",
    )
    grid: dict[str, list[list[float]]] = {k: [] for k in keys}
    for pipe in pipelines:
        rows: dict[str, list[float]] = {k: [] for k in grid}
        for peer in pipe:
            timed = medians[peer] if peer < len(medians) else None
            if timed is None:
                return None

            def spent(name: str, timed: dict[str, float] = timed) -> float:
                return timed.get(f"{name}_cpu_s", timed[f"{name}_s"])

            rows["forward"].append(spent("forward") / micro_batches)
            rows["backward"].append(spent("backward") / micro_batches)
            rows["update"].append(spent("update"))
            local = timed.get("averaging_cpu_s", 0.0)
            rows["local"].append(local)
            # unsplit (an older worker, a round without parts): all of it before the wire
            rows["before"].append(local * timed.get("averaging_before_share", 1.0))
            rows["after"].append(local * timed.get("averaging_after_share", 0.0))
            rows["frame"].append(timed.get("frame_cpu_s", 0.0))
            rows["helpers"].append(timed.get("helpers_cores", 0.0))
            quota = (cores or {}).get(peer)
            rows["cores"].append(quota or 0.0)
            rows["period"].append(cpu.period_us(quota) / 1e6 if quota else 0.0)
        for k in grid:
            grid[k].append(rows[k])
    quotas = all(c > 0 for row in grid["cores"] for c in row)
    return MeasuredCompute(
        grid["forward"],
        grid["backward"],
        grid["update"],
        grid["local"],
        grid["frame"],
        quota_cores=grid["cores"] if quotas else (),
        quota_period_s=grid["period"] if quotas else (),
        averaging_before_s=grid["before"],
        averaging_after_s=grid["after"],
        background_cores=grid["helpers"] if quotas else (),
    )


def compute_summary(
    logs: Sequence[Path], plan_key: tuple[int, int], pipelines: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """The JSON of the run's measured stage times: per pipeline, per stage, seconds per step."""
    medians = stage_medians(logs, plan_key)

    def of(peer: int, key: str) -> float | None:
        timed = medians[peer] if peer < len(medians) else None
        return None if timed is None or key not in timed else round(timed[key], 4)

    keys = (
        *COMPUTE_FIELDS,
        *CPU_FIELDS,
        "averaging_s",
        "averaging_cpu_s",
        "averaging_before_share",
        "averaging_after_share",
        "frame_cpu_s",
        "helpers_cores",
        "step_s",
    )
    return {key: [[of(peer, key) for peer in pipe] for pipe in pipelines] for key in keys}


def steady_step_s(
    logs: Sequence[Path], plan_key: tuple[int, int], pipelines: Sequence[Sequence[int]]
) -> float | None:
    """The steady-state step as the placed workers time it: the median over them of each one's
    median step (the first left out), what the step-time model predicts. The harness's own
    finish times also carry its polling and any one slow step (a retried round)."""
    medians = stage_medians(logs, plan_key)
    times = [
        timed["step_s"]
        for pipe in pipelines
        for peer in pipe
        if peer < len(medians) and (timed := medians[peer]) is not None and "step_s" in timed
    ]
    return statistics.median(times) if times else None


def swarm_step_times(
    logs: Sequence[Path], plan_key: tuple[int, int], pipelines: Sequence[Sequence[int]]
) -> list[float]:
    """Each step under the plan, in step order, as the placed workers timed it: the longest
    `step_s` any of them reported for it (a step waits for its slowest stage; under diloco, a
    step that waits for a round shows here)."""
    longest: dict[int, float] = {}
    for peer in {p for pipe in pipelines for p in pipe}:
        if peer < len(logs):
            for s in read_steps(logs[peer], plan_key):
                longest[s.metrics.step] = max(longest.get(s.metrics.step, 0.0), s.metrics.step_s)
    return [longest[step] for step in sorted(longest)]
