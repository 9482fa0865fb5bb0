"""The whole training step, simulated: compute, bubbles and frames together (step_time.py
prices its communication alone).

simulated_step_s() runs the same frames and averaging as step_time() on a simulated GPipe
schedule (gpipe_sim.py) with each stage's compute (measured by the workers in the bench, timed by
the probes in the live planner's shape choice), each stage's work on its machine's CPU budget
(cpu_budget.py), so compute, bubbles and their overlap with the frames are in it; under DiLoCo
its rounds run beside the inner steps (outer_round.py).
Pure numpy, like the rest of the scheduler. Units as step_time.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from p2ptrain.schedule.cpu_budget import CpuBudget
from p2ptrain.schedule.gpipe_sim import StageWork, one_replica
from p2ptrain.schedule.outer_round import overlapped_step_s, round_cpu_share_s
from p2ptrain.schedule.step_time import FloatArray, StepTraffic, stage_exchanges_s


@dataclass(frozen=True)
class MeasuredCompute:
    """Measured compute of each (replica, stage), seconds: forward of one micro-batch, backward of
    one micro-batch, and the update after averaging (clipping and the optimizer step)."""

    forward_s: Sequence[Sequence[float]]  # [replica][stage]
    backward_s: Sequence[Sequence[float]]
    update_s: Sequence[Sequence[float]]
    # the local work of each member's averaging round (serialising, reducing, the daemon's
    # copies), CPU seconds of its machine; empty: not measured (counted as none)
    averaging_local_s: Sequence[Sequence[float]] = ()
    # the local work of each frame the stage sends or receives (serialising, the asyncio thread,
    # the daemon's copies: CPU besides the passes, per frame), CPU seconds; empty: none
    frame_local_s: Sequence[Sequence[float]] = ()
    # the CPU quota each stage's machine runs under, in cores, and the period it is handed out
    # in (CFS: that share of every period), seconds; empty: none. All of a stage's work draws
    # on it (CpuBudget), so the times above are then CPU seconds, the passes' too
    quota_cores: Sequence[Sequence[float]] = ()
    quota_period_s: Sequence[Sequence[float]] = ()
    # of averaging_local_s, what was spent before the round's first part left and after its last part
    # arrived; the rest runs while parts are on the wire. Empty: not measured (all before)
    averaging_before_s: Sequence[Sequence[float]] = ()
    averaging_after_s: Sequence[Sequence[float]] = ()
    # CPU the machine spends beside all of that at a steady rate (hivemind's DHT and averager
    # processes between rounds), cores: it leaves the stage's work that much less of its quota;
    # empty: none
    background_cores: Sequence[Sequence[float]] = ()


SIMULATED_STEPS = 6  # the period settles within a few steps; the model reports the last one


def simulated_step_s(
    delay_ms: FloatArray,
    bandwidth_gbps: FloatArray,
    pipelines: Sequence[Sequence[int]],
    traffic: StepTraffic,
    compute: MeasuredCompute,
    steps: int = SIMULATED_STEPS,
) -> float:
    """The steady-state step of `pipelines` with the stages' measured compute and the links'
    delay and rate: GPipe as worker/pipeline/stage_step.py runs it, step after step, with averaging.

    Each stage works one thing at a time: forward of micro-batches 0..M-1 (each once its input
    arrived), then backward of M-1..0 (each once its output's gradient arrived), then its part
    of its group's averaging (_group_round: a round's local work before its first part leaves,
    then group_averaging_s on the links once every member is that far, with the work beside the
    wire alongside, then the work after its last part), then updates. Every frame it sends or
    takes in also costs it its measured local work (frame_local_s). All of that work runs on
    the stage's machine (CpuBudget: under its CPU quota, less a measured background, where
    there is one).
    Frames leave without blocking compute; each direction of a link serialises them (a frame
    arrives one-way delay + its bytes / rate after its link is free) and the stage's step ends
    once the answer to its last frame is back. The next step of a stage starts after its
    update. The result is the gap between the last two simulated steps'
    ends, so compute, bubbles and the overlap of frames with compute are all in it."""
    delay_s = np.asarray(delay_ms, dtype=np.float64) / 1e3
    rate_bps = np.asarray(bandwidth_gbps, dtype=np.float64) * 1e9
    num_stages, micros, inner = len(pipelines[0]), traffic.micro_batches, traffic.inner_steps
    groups = stage_exchanges_s(delay_s, rate_bps, pipelines, traffic)
    rounds_cpu = [
        [
            _round_cpu_s(compute, r, s) if groups[s] > 0 else (0.0, 0.0, 0.0)
            for r in range(len(pipelines))
        ]
        for s in range(num_stages)
    ]
    machines = [[_machine(compute, r, s) for s in range(num_stages)] for r in range(len(pipelines))]
    ready = np.zeros((len(pipelines), num_stages))  # when each stage may start the next step
    ends: list[float] = []
    for _ in range(steps):
        done = np.zeros_like(ready)  # backward of micro-batch 0 finished
        for r, pipe in enumerate(pipelines):
            frame_local = compute.frame_local_s[r] if compute.frame_local_s else [0.0] * len(pipe)
            stage = StageWork(compute.forward_s[r], compute.backward_s[r], frame_local, machines[r])
            done[r] = one_replica(
                delay_s, rate_bps, pipe, micros, traffic.activation_bytes * 8, ready[r], stage
            )
        for s in range(num_stages):
            if inner:  # diloco: no round inside the step; its local work is priced below
                for r in range(len(pipelines)):
                    ready[r, s] = machines[r][s].run(done[r, s], compute.update_s[r][s])
                continue
            averaged = _group_round(
                [machines[r][s] for r in range(len(pipelines))],
                list(done[:, s]),
                groups[s],
                rounds_cpu[s],
            )
            for r in range(len(pipelines)):
                ready[r, s] = machines[r][s].run(averaged[r], compute.update_s[r][s])
        ends.append(float(ready.max()))
    step_s = ends[-1] - ends[-2] if len(ends) > 1 else ends[-1]
    if not inner:
        return step_s
    # each stage's round, on fresh machines, runs beside the next H steps (outer_round.py)
    rounds_s = [
        max(
            _group_round(
                [_machine(compute, r, s) for r in range(len(pipelines))],
                [0.0] * len(pipelines),
                groups[s],
                rounds_cpu[s],
            )
        )
        for s in range(num_stages)
    ]
    # where a round's local CPU lands: the stage's idle time first, then every step
    step_s += max(
        round_cpu_share_s(
            step_s,
            _busy_cpu_s(compute, r, s, micros, num_stages),
            compute.quota_cores[r][s] if compute.quota_cores else None,
            sum(rounds_cpu[s][r]),
            inner,
        )
        for r in range(len(pipelines))
        for s in range(num_stages)
    )
    return overlapped_step_s(step_s, rounds_s, inner)


def _busy_cpu_s(compute: MeasuredCompute, r: int, s: int, micros: int, num_stages: int) -> float:
    """(r, s)'s own CPU in a step: its passes, its update, and its frames' local work (each
    micro-batch's activation and gradient, in and out, on each boundary it has)."""
    frame_s = compute.frame_local_s[r][s] if compute.frame_local_s else 0.0
    boundaries = (s > 0) + (s < num_stages - 1)
    passes_s = micros * (compute.forward_s[r][s] + compute.backward_s[r][s])
    return passes_s + compute.update_s[r][s] + 2 * micros * boundaries * frame_s


# the least share of its quota a stage's work keeps beside a measured background (a background
# measured above the rest did not run beside the stage's work: the stage would hardly have run)
MIN_QUOTA_LEFT = 0.1


def _machine(compute: MeasuredCompute, r: int, s: int) -> CpuBudget:
    """(r, s)'s machine: its quota less its background, or no quota."""
    if not compute.quota_cores:
        return CpuBudget()
    cores = compute.quota_cores[r][s]
    background = compute.background_cores[r][s] if compute.background_cores else 0.0
    return CpuBudget(max(cores - background, cores * MIN_QUOTA_LEFT), compute.quota_period_s[r][s])


def _round_cpu_s(compute: MeasuredCompute, r: int, s: int) -> tuple[float, float, float]:
    """The local work of (r, s)'s averaging round: before its first part leaves, while parts
    are on the wire, after its last part arrived (CPU seconds)."""
    total = compute.averaging_local_s[r][s] if compute.averaging_local_s else 0.0
    if not compute.averaging_before_s:
        return total, 0.0, 0.0
    before, after = compute.averaging_before_s[r][s], compute.averaging_after_s[r][s]
    return before, max(0.0, total - before - after), after


def _group_round(
    machines: Sequence[CpuBudget],
    done: Sequence[float],
    network_s: float,
    cpu_s: Sequence[tuple[float, float, float]],
) -> list[float]:
    """When each member of a stage's group holds the averaged gradient: each prepares its round
    once its backward pass is done (`done`), the group's network time (group_averaging_s) starts
    once all are ready and ends no sooner than every member's work beside the wire, then each
    finishes its own part."""
    if network_s <= 0:
        return [float(t) for t in done]
    members = list(zip(machines, done, cpu_s, strict=True))
    ready = max(m.run(float(t), before) for m, t, (before, _, _) in members)
    beside = [m.run(ready, during) for m, _, (_, during, _) in members]
    wire_done = max(ready + network_s, *beside)
    return [m.run(wire_done, after) for m, _, (_, _, after) in members]
