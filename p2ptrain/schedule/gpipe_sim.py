"""One replica's GPipe step on its links, for the step simulation (step_sim.py's
simulated_step_s): every stage's forward and backward micro-batches and the frames between them,
each piece of work on the stage's machine (CpuBudget). Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from p2ptrain.schedule.cpu_budget import CpuBudget

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StageWork:
    """One replica's stages: per micro-batch compute and per frame local work, and the machine
    each runs on."""

    forward_s: Sequence[float]
    backward_s: Sequence[float]
    frame_local_s: Sequence[float]
    machines: Sequence[CpuBudget]

    def run(self, s: int, start: float, cpu_s: float) -> float:
        return self.machines[s].run(start, cpu_s)


def one_replica(
    delay_s: FloatArray,
    rate_bps: FloatArray,
    pipe: Sequence[int],
    micros: int,
    frame_bits: float,
    ready: FloatArray,
    work: StageWork,
) -> FloatArray:
    """When each stage of one replica finishes the step's backward pass (step_sim.simulated_step_s).
    Each frame a stage sends or takes in costs it frame_local_s[s] on its machine, in line with
    its compute."""
    stages = len(pipe)

    def deliver(link_free: float, sent: float, a: int, b: int) -> tuple[float, float]:
        start = max(link_free, sent)
        free = start + frame_bits / rate_bps[a, b]
        return free, free + delay_s[a, b]

    busy = np.array(ready, dtype=np.float64)  # each stage's compute is free from this time
    acked = np.zeros(stages)  # the receiver's answer to the stage's last frame is back
    arrive = np.zeros(micros)  # activations of micro-batch m reaching the current stage
    for s in range(stages):
        link_free, out = 0.0, np.zeros(micros)
        for m in range(micros):
            if s:  # take the activations in
                busy[s] = work.run(s, max(busy[s], arrive[m]), work.frame_local_s[s])
            busy[s] = work.run(s, busy[s], work.forward_s[s])
            if s + 1 < stages:
                busy[s] = work.run(s, busy[s], work.frame_local_s[s])
                link_free, out[m] = deliver(link_free, busy[s], pipe[s], pipe[s + 1])
        arrive = out
    grads = np.full(micros, busy[-1])  # the last stage's backward needs no frame
    for s in reversed(range(stages)):
        link_free, out = 0.0, np.zeros(micros)
        for m in reversed(range(micros)):
            start = max(busy[s], grads[m])
            if s < stages - 1:  # take the gradient in
                start = work.run(s, start, work.frame_local_s[s])
            busy[s] = work.run(s, start, work.backward_s[s])
            if s > 0:
                busy[s] = work.run(s, busy[s], work.frame_local_s[s])
                link_free, out[m] = deliver(link_free, busy[s], pipe[s], pipe[s - 1])
                acked[s] = out[m] + delay_s[pipe[s - 1], pipe[s]]
        grads = out
    # a step ends once every frame it sent was accepted (worker/pipeline/stage_step.py waits for them)
    return np.maximum(busy, acked)
