"""DiLoCo's outer rounds in the step-time model (step_time.py): sync = "diloco".

Each stage's group exchanges its compressed pseudo-gradient once every H inner steps. Streaming
DiLoCo staggers the stages' rounds within H and runs each beside the next inner steps (its
result applied a bounded number of steps later), so a round costs a step nothing while it takes
less than H steps; beyond that, the replicas wait for it. In the steady state a step then lasts

    step = max(inner step, max over stages j of round_j / H)

where the inner step is the pipeline's own (no averaging in it; the round's local CPU, at a
lower priority, fills the machine's idle time beside the passes first, and only what does not
fit there is spread over the H steps: round_cpu_share_s) and round_j is stage j's exchange on its group's
links (an all-reduce, step_time.group_averaging_s; a sparse gather for top-k, group_gather_s)
with its members' local work. Pure Python, units as step_time.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def group_gather_s(
    delay_s: FloatArray, rate_bps: FloatArray, members: Sequence[int], payload_bytes: float
) -> float:
    """A sparse gather in a stage's group (top-k pseudo-gradients: sparse entries do not reduce
    in place): after the metadata swap (one one-way delay), every member sends its whole payload
    to every other at once, a link each; done when the last payload lands. 0 for one member."""
    if len(members) < 2:
        return 0.0
    bits = payload_bytes * 8
    start = {a: max(delay_s[b, a] for b in members if b != a) for a in members}
    return float(
        max(
            start[a] + bits / rate_bps[a, b] + delay_s[a, b]
            for a in members
            for b in members
            if a != b
        )
    )


def round_cpu_share_s(
    step_s: float, busy_cpu_s: float, cores: float | None, round_cpu_s: float, inner_steps: int
) -> float:
    """What a member's round adds to each step by its local CPU (round_cpu_s over the outer
    period). The round's thread runs at a lower priority than the passes (the worker nices it),
    so its CPU first fills the machine's idle time beside them (pipeline bubbles, waits for
    frames: cores x step_s less the stage's own busy_cpu_s, each of the H steps); only what does
    not fit there slows the steps, spread over H. No quota (cores None): one core."""
    idle_s = max(0.0, (1.0 if cores is None else cores) * step_s - busy_cpu_s)
    return max(0.0, round_cpu_s - inner_steps * idle_s) / inner_steps


def overlapped_step_s(inner_step_s: float, rounds_s: Sequence[float], inner_steps: int) -> float:
    """The steady-state step when each stage's round (rounds_s, wall seconds) runs beside the
    next `inner_steps` (H) steps: the inner step, or a round's share of H if that is longer."""
    if inner_steps < 1:
        raise ValueError(f"inner_steps must be >= 1, got {inner_steps}")
    return max(inner_step_s, max(rounds_s, default=0.0) / inner_steps)
