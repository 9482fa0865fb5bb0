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

COMPUTE_FIELDS = ("forward_s", "backward_s", "update_s")


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
        framed = [
            float(r["frames_cpu_s"]) / int(r["frames"])
            for r in steady
            if isinstance(r.get("frames_cpu_s"), int | float)
            and isinstance(r.get("frames"), int)
            and r["frames"] > 0
        ]
        if framed:
            medians["frame_cpu_s"] = statistics.median(framed)
        periods = [float(r["step_s"]) for r in steady if isinstance(r.get("step_s"), int | float)]
        if periods:
            medians["step_s"] = statistics.median(periods)
        result.append(medians)
    return result


def measured_compute(
    logs: Sequence[Path],
    plan_key: tuple[int, int],
    pipelines: Sequence[Sequence[int]],
    micro_batches: int,
    cores: Mapping[int, float] | None = None,
) -> MeasuredCompute | None:
    """The (replica, stage) grid of per-micro-batch forward and backward seconds and the
    update's, for pipelines of peer indices (index i: logs[i]); None if a stage was not timed.
    With `cores` (peer index -> the CPU quota its worker ran under), the local work of each
    averaging round and of each frame too: the CPU seconds its process tree spent in the round,
    and per frame during the passes besides their compute, at that quota."""
    medians = stage_medians(logs, plan_key)
    grid: dict[str, list[list[float]]] = {k: [] for k in (*COMPUTE_FIELDS, "local", "frame")}
    for pipe in pipelines:
        rows: dict[str, list[float]] = {k: [] for k in grid}
        for peer in pipe:
            timed = medians[peer] if peer < len(medians) else None
            if timed is None:
                return None
            rows["forward_s"].append(timed["forward_s"] / micro_batches)
            rows["backward_s"].append(timed["backward_s"] / micro_batches)
            rows["update_s"].append(timed["update_s"])
            quota = (cores or {}).get(peer)
            cpu_s = timed.get("averaging_cpu_s", 0.0)
            rows["local"].append(cpu_s / quota if quota else cpu_s)
            frame_s = timed.get("frame_cpu_s", 0.0)
            rows["frame"].append(frame_s / quota if quota else frame_s)
        for k in grid:
            grid[k].append(rows[k])
    return MeasuredCompute(
        grid["forward_s"], grid["backward_s"], grid["update_s"], grid["local"], grid["frame"]
    )


def compute_summary(
    logs: Sequence[Path], plan_key: tuple[int, int], pipelines: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """The JSON of the run's measured stage times: per pipeline, per stage, seconds per step."""
    medians = stage_medians(logs, plan_key)

    def of(peer: int, key: str) -> float | None:
        timed = medians[peer] if peer < len(medians) else None
        return None if timed is None or key not in timed else round(timed[key], 4)

    return {
        key: [[of(peer, key) for peer in pipe] for pipe in pipelines]
        for key in (*COMPUTE_FIELDS, "averaging_s", "averaging_cpu_s", "frame_cpu_s", "step_s")
    }


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
