"""What the stages of a `bench e2e` run computed, from the workers' metrics logs, for the
step-time simulation (schedule/step_time.py's simulated_step_s).

Each worker's report of a step carries `forward_s`, `backward_s` (its stage's forward and
backward passes over all micro-batches, waits for frames left out) and `update_s` (clipping
and the optimizer step); `averaging_s` is the wall time of the step's averaging round. The
median over the plan's steps (the first one left out: it warms up) is what the stage takes.
These are measurements of the run itself, not fitted to its step time: the simulation adds the
links (delay, rate) and the schedule (bubbles, overlap, averaging) on top.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from p2ptrain.harness.e2e_traffic import read_metrics
from p2ptrain.schedule.step_time import MeasuredCompute
from p2ptrain.testbed import cpu

COMPUTE_FIELDS = ("forward_s", "backward_s", "update_s")
# the worker thread's CPU seconds in the same pieces (workers from 2026-11-25 on)
CPU_FIELDS = ("forward_cpu_s", "backward_cpu_s", "update_cpu_s")
# the process tree's CPU in the averaging round, and of it before the first part left and after
# the last arrived (workers from 2026-11-25 on: the rest overlaps the wire)
ROUND_CPU_FIELDS = ("averaging_cpu_s", "averaging_cpu_before_s", "averaging_cpu_after_s")


def stage_medians(logs: Sequence[Path], plan_key: tuple[int, int]) -> list[dict[str, float] | None]:
    """Per worker (in the order of `logs`): the median of each timing field over its reports
    under the plan, the first step left out; None for a worker without them (a spare, or a
    worker that does not time its stage)."""
    result: list[dict[str, float] | None] = []
    for path in logs:
        mine = [
            r
            for r in read_metrics(path)
            if (r.get("term"), r.get("epoch")) == plan_key
            and all(isinstance(r.get(k), int | float) for k in COMPUTE_FIELDS)
        ]
        steady = mine[1:] or mine
        if not steady:
            result.append(None)
            continue
        medians = {k: statistics.median(float(r[k]) for r in steady) for k in COMPUTE_FIELDS}
        waits = [
            float(r["averaging_s"]) for r in steady if isinstance(r.get("averaging_s"), int | float)
        ]
        if waits:
            medians["averaging_s"] = statistics.median(waits)
        cpu = [
            float(r["averaging_cpu_s"])
            for r in steady
            if isinstance(r.get("averaging_cpu_s"), int | float)
        ]
        if cpu:
            medians["averaging_cpu_s"] = statistics.median(cpu)
        medians.update(_round_cpu_shares(steady))
        for key in CPU_FIELDS:
            spent = [float(r[key]) for r in steady if isinstance(r.get(key), int | float)]
            if spent:
                medians[key] = statistics.median(spent)
        medians.update(_passes_cpu(steady))
        periods = [float(r["step_s"]) for r in steady if isinstance(r.get("step_s"), int | float)]
        if periods:
            medians["step_s"] = statistics.median(periods)
        result.append(medians)
    return result


def _passes_cpu(reports: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The frames' CPU per frame and the helper processes' CPU rate during the passes (cores),
    as ratios of sums like the round's shares below; {} where not reported."""
    framed = [
        (float(r["frames_cpu_s"]), int(r["frames"]))
        for r in reports
        if isinstance(r.get("frames_cpu_s"), int | float) and isinstance(r.get("frames"), int)
    ]
    result = {}
    if sum(n for _, n in framed) > 0:
        result["frame_cpu_s"] = sum(cpu for cpu, _ in framed) / sum(n for _, n in framed)
    # the passes' wall time: the step less its round and its update (session.py's pieces)
    helped = [
        (float(r["helpers_cpu_s"]), float(r["step_s"]) - float(r["averaging_s"]) - float(r["update_s"]))
        for r in reports
        if all(isinstance(r.get(k), int | float)
               for k in ("helpers_cpu_s", "step_s", "averaging_s", "update_s"))
    ]  # fmt: skip
    if sum(wall for _, wall in helped) > 0:
        result["helpers_cores"] = sum(cpu for cpu, _ in helped) / sum(w for _, w in helped)
    return result


def _round_cpu_shares(reports: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The shares of the round's CPU spent before its first part left and after its last part
    arrived, over the reports that split it: as sums, not medians, since the process tree's
    clock ticks in 10 ms, a fair share of a round's CPU here (a sum's rounding errors cancel
    out, a median's do not); {} if none split it."""
    split = [
        (float(r["averaging_cpu_s"]), float(r["averaging_cpu_before_s"]),
         float(r["averaging_cpu_after_s"]))
        for r in reports
        # a reading below 0: a worker's clock that dropped an ended process (before 2026-11-25)
        if all(isinstance(r.get(k), int | float) and r[k] >= 0 for k in ROUND_CPU_FIELDS)
    ]  # fmt: skip
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
    keys = ("forward", "backward", "update", "local", "frame", "cores", "period", "before",
            "after", "helpers")  # fmt: skip
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

    keys = (*COMPUTE_FIELDS, *CPU_FIELDS, "averaging_s", "averaging_cpu_s",
            "averaging_before_share", "averaging_after_share", "frame_cpu_s", "helpers_cores",
            "step_s")  # fmt: skip
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
