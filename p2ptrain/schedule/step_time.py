"""Communication time of one training step of a plan, as p2ptrain's data plane spends it.

The paper's cost (cost.py: DP + 2 x PP) prices one transfer of a replica's activations per
boundary and one exchange of gradients per data-parallel pair. The data plane does more, in
ways that matter at WAN round trips (docs/scheduler.md, "Step time on the data plane"):

- GPipe sends every micro-batch as its own frame, forward (activations) and backward (their
  gradients). A frame takes one-way delay + size / rate (measured on the testbed: opening a
  p2pd stream costs no extra round trip). Micro-batches overlap: a pass pays the latency of
  every boundary once and the slowest boundary's serialisation once more per extra micro-batch.
- Averaging inside a stage's group of R replicas, the group the plan fixes
  (worker/averaging/planned_group.py): each member first sends its round metadata to every other member
  (one one-way delay; a member starts once it holds everyone's), then hivemind's all-reduce:
  each member reduces an even share (1/R) of the gradient, which travels in parts: every member
  sends its piece of each share to that share's reducer, the reducer averages a part once
  every piece of it arrived and sends the average back on the same link, after that link's own
  pieces (group_averaging_s; links run in parallel). No DHT: matchmaking through it is only
  the retry of a failed round, which the model leaves out.
- The critical path: stage j averages once the backward pass is back at j, and the next step's
  forward pass reaches j only after that. So a step lasts, for the worst j, the forward pass
  from j to the last stage, the backward pass back to j, and stage j's averaging; for j = 0
  that is the whole pipeline plus the first stage's averaging.

step_time() is communication only; the whole step, with compute, bubbles and their overlap with
the frames, is simulated on the same frames and averaging by step_sim.py (simulated_step_s).
Pure numpy, like the rest of the scheduler. Units: delay_ms one-way, bandwidth Gbit/s (the
topology's), sizes in bytes, times in seconds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from p2ptrain.schedule.outer_round import group_gather_s

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StepTraffic:
    """What one training step moves.

    stage_gradient_bytes[j]: stage j's gradient at the wire precision (averaged within stage j).
    activation_bytes: one micro-batch of one replica crossing one boundary, one direction
        (the gradient sent back has the same size).
    inner_steps: 0 averages every stage's gradient in every step (sync = "step"); H > 0 is
        DiLoCo: stage_gradient_bytes is then each member's compressed pseudo-gradient, exchanged
        once every H steps beside the inner steps (outer_round.py).
    sparse_gather: the exchange is a gather of every member's whole payload (top-k), not an
        all-reduce.
    """

    stage_gradient_bytes: tuple[float, ...]
    activation_bytes: float
    micro_batches: int
    inner_steps: int = 0
    sparse_gather: bool = False

    def __post_init__(self) -> None:
        if self.micro_batches < 1 or self.inner_steps < 0:
            raise ValueError(f"need micro_batches >= 1 and inner_steps >= 0, got {self}")
        if self.activation_bytes < 0 or any(b < 0 for b in self.stage_gradient_bytes):
            raise ValueError("sizes must be >= 0")


@dataclass(frozen=True)
class StepTime:
    """The parts of one step's communication time (seconds)."""

    comm_s: float  # the critical path: max over stages j of passes from j and back + DP_j
    # (diloco: the passes, or the slowest stage's round over H where that is longer)
    critical_stage: int  # the j that sets it
    pipeline_s: float  # forward + backward of the slowest replica through all stages
    averaging_s: float  # the slowest stage group's metadata swap + all-reduce (diloco: a round)
    group_averaging_s: tuple[float, ...]  # per stage


def pass_time_s(
    delays_s: Sequence[float], rates_bps: Sequence[float], traffic: StepTraffic
) -> float:
    """One direction of one pipeline (its boundaries in order): every micro-batch crosses every
    boundary; micro-batches overlap, the slowest boundary serialises them."""
    if not delays_s:
        return 0.0
    bits = traffic.activation_bytes * 8
    transfer_s = [bits / rate for rate in rates_bps]
    latency_s = sum(delays_s)
    return latency_s + sum(transfer_s) + (traffic.micro_batches - 1) * max(transfer_s)


# How the data plane cuts a tensor for averaging (worker/averaging/stage_averager.py passes it to hivemind):
# each member's share of the tensor in PARTS_PER_SHARE parts at least, MAX_PART_BYTES at most
# each. hivemind hands every part to one reducer whole, so parts must be smaller than a share
# for the shares to be even, and several parts let a reducer send one part's average back
# while the next part is still on the wire.
PARTS_PER_SHARE = 4
MAX_PART_BYTES = 2**19  # hivemind's default part size


def part_size_bytes(tensor_bytes: float, members: int, value_bytes: int = 1) -> int:
    """The size of the parts a tensor of `tensor_bytes` (on the wire, `value_bytes` a value) is
    averaged in by a group of `members`: one value at least."""
    share = tensor_bytes / max(members, 1)
    return max(value_bytes, min(MAX_PART_BYTES, math.ceil(share / PARTS_PER_SHARE)))


def group_averaging_s(
    delay_s: FloatArray, rate_bps: FloatArray, members: Sequence[int], gradient_bytes: float
) -> float:
    """Metadata swap + all-reduce of one stage's group, all members starting together (0 for a
    group of one): the time until the last member holds every averaged part.

    Each member's share (1/R of the gradient) travels in parts (part_size_bytes). A member
    sends its pieces of the others' shares first; a reducer reduces part j once every member's
    part j arrived and sends its average back to each member on the same link, after that
    link's own pieces: each direction of a link carries 2/R of the gradient."""
    num = len(members)
    if num < 2:
        return 0.0
    share_bits = gradient_bytes * 8 / num
    parts = max(1, math.ceil(gradient_bytes / num / part_size_bytes(gradient_bytes, num)))
    part_bits = share_bits / parts
    # member a may start once every groupmate's metadata reached it
    start = {a: max(delay_s[b, a] for b in members if b != a) for a in members}
    # part j of b's share from a reaches b (a sends its pieces of every share at once, a link
    # for each groupmate)
    reduced = {
        b: [
            max(
                start[b]
                if a == b
                else start[a] + (j + 1) * part_bits / rate_bps[a, b] + delay_s[a, b]
                for a in members
            )
            for j in range(parts)
        ]
        for b in members
    }
    done = 0.0
    for b in members:  # b's averages back to each a, after b's own pieces on that link
        for a in members:
            if a == b:
                continue
            sent = start[b] + share_bits / rate_bps[b, a]
            for j in range(parts):
                sent = max(sent, reduced[b][j]) + part_bits / rate_bps[b, a]
            done = max(done, float(sent + delay_s[b, a]))
    return done


def step_time(
    delay_ms: FloatArray,
    bandwidth_gbps: FloatArray,
    pipelines: Sequence[Sequence[int]],
    traffic: StepTraffic,
) -> StepTime:
    """Communication time of one step of `pipelines` (pipelines[r][s]: peer of stage s in
    replica r) on links of one-way delay_ms and bandwidth_gbps."""
    delay_s = np.asarray(delay_ms, dtype=np.float64) / 1e3
    rate_bps = np.asarray(bandwidth_gbps, dtype=np.float64) * 1e9
    stages = len(pipelines[0])
    if len(traffic.stage_gradient_bytes) != stages:
        raise ValueError(f"{len(traffic.stage_gradient_bytes)} gradient sizes for {stages} stages")
    groups = tuple(stage_exchanges_s(delay_s, rate_bps, pipelines, traffic))
    # round trip of the passes from stage j to the last stage and back, slowest replica
    from_stage = [
        max(_passes_s(delay_s, rate_bps, pipe[j:], traffic) for pipe in pipelines)
        for j in range(stages)
    ]
    if traffic.inner_steps:  # diloco: the rounds run beside the passes, each spread over H
        paths = [max(from_stage[0], groups[j] / traffic.inner_steps) for j in range(stages)]
    else:
        paths = [from_stage[j] + groups[j] for j in range(stages)]
    critical = int(np.argmax(paths))
    return StepTime(
        comm_s=float(paths[critical]),
        critical_stage=critical,
        pipeline_s=float(from_stage[0]),
        averaging_s=max(groups),
        group_averaging_s=groups,
    )


def stage_exchanges_s(
    delay_s: FloatArray,
    rate_bps: FloatArray,
    pipelines: Sequence[Sequence[int]],
    traffic: StepTraffic,
) -> list[float]:
    """Each stage group's exchange on its links, all members starting together: an all-reduce
    (group_averaging_s), or a sparse gather for top-k (outer_round.group_gather_s)."""
    exchange = group_gather_s if traffic.sparse_gather else group_averaging_s
    return [
        exchange(delay_s, rate_bps, [pipe[s] for pipe in pipelines], size)
        for s, size in enumerate(traffic.stage_gradient_bytes)
    ]


def _passes_s(
    delay_s: FloatArray, rate_bps: FloatArray, pipe: Sequence[int], traffic: StepTraffic
) -> float:
    """Forward through `pipe` and backward through it (each on its own direction of the links)."""
    hops = list(itertools.pairwise(pipe))
    forward = pass_time_s(
        [delay_s[a, b] for a, b in hops], [rate_bps[a, b] for a, b in hops], traffic
    )
    back = [(b, a) for a, b in hops[::-1]]
    backward = pass_time_s(
        [delay_s[a, b] for a, b in back], [rate_bps[a, b] for a, b in back], traffic
    )
    return forward + backward
