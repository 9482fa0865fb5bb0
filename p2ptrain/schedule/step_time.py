"""Communication time of one training step of a plan, as p2ptrain's data plane spends it.

The paper's cost (cost.py: DP + 2 x PP) prices one transfer of a replica's activations per
boundary and one exchange of gradients per data-parallel pair. The data plane does more, in
ways that matter at WAN round trips (docs/scheduler.md, "Step time on the data plane"):

- GPipe sends every micro-batch separately, forward (activations) and backward (gradients).
  Each frame opens a new p2pd stream, whose protocol negotiation costs a round trip before the
  payload leaves: a frame takes FRAME_OPEN_ROUND_TRIPS x RTT + one-way delay + size / rate.
  Micro-batches overlap, so a pipeline pays the latency of every boundary once and the
  serialisation of the slowest boundary once more per extra micro-batch.
- hivemind's all-reduce inside a stage's group of R replicas: each member sends 1/R of its
  gradient to every other member and gets the averaged part back (per pair: two one-way delays,
  two transfers of G / R; pairs run in parallel on separate links), after matchmaking, whose
  join request and answer cost MATCHMAKING_ROUND_TRIPS round trips of the group's slowest pair.
- The stages average in parallel; the slowest group counts once, after the pipeline.

Pure numpy, like the rest of the scheduler. Units: delay_ms one-way, bandwidth Gbit/s (the
topology's), sizes in bytes, times in seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

FRAME_OPEN_ROUND_TRIPS = 1.0  # multistream negotiation of each new stream, before the payload
MATCHMAKING_ROUND_TRIPS = 1.0  # join request -> accepted/begin, once the group is complete


@dataclass(frozen=True)
class StepTraffic:
    """What one training step moves.

    stage_gradient_bytes[j]: stage j's gradient at the wire precision (averaged within stage j).
    activation_bytes: one micro-batch of one replica crossing one boundary, one direction
        (the gradient sent back has the same size).
    """

    stage_gradient_bytes: tuple[float, ...]
    activation_bytes: float
    micro_batches: int

    def __post_init__(self) -> None:
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")
        if self.activation_bytes < 0 or any(b < 0 for b in self.stage_gradient_bytes):
            raise ValueError("sizes must be >= 0")


@dataclass(frozen=True)
class StepTime:
    """The parts of one step's communication time (seconds)."""

    pipeline_s: float  # forward + backward of the slowest replica, all micro-batches
    averaging_s: float  # the slowest stage group's matchmaking + all-reduce
    group_averaging_s: tuple[float, ...]  # per stage

    @property
    def comm_s(self) -> float:
        return self.pipeline_s + self.averaging_s


def frame_latency_s(delay_s: float) -> float:
    """Fixed time of one frame over a link of one-way delay_s: stream negotiation + delivery."""
    return FRAME_OPEN_ROUND_TRIPS * 2 * delay_s + delay_s


def pass_time_s(
    delays_s: Sequence[float], rates_bps: Sequence[float], traffic: StepTraffic
) -> float:
    """One direction of one pipeline (its boundaries in order): every micro-batch crosses every
    boundary; micro-batches overlap, the slowest boundary serialises them."""
    if not delays_s:
        return 0.0
    bits = traffic.activation_bytes * 8
    transfer_s = [bits / rate for rate in rates_bps]
    latency_s = sum(frame_latency_s(d) for d in delays_s)
    return latency_s + sum(transfer_s) + (traffic.micro_batches - 1) * max(transfer_s)


def group_averaging_s(
    delay_s: FloatArray, rate_bps: FloatArray, members: Sequence[int], gradient_bytes: float
) -> float:
    """Matchmaking + all-reduce of one stage's group (0 for a group of one)."""
    num = len(members)
    if num < 2:
        return 0.0
    part_bits = gradient_bytes * 8 / num
    slowest_s, slowest_rtt_s = 0.0, 0.0
    for a in members:
        for b in members:
            if a == b:
                continue
            # a's part to b and b's averaged part back: both directions of the pair
            pair_s = delay_s[a, b] + part_bits / rate_bps[a, b] + delay_s[b, a]
            pair_s += part_bits / rate_bps[b, a]
            slowest_s = max(slowest_s, pair_s)
            slowest_rtt_s = max(slowest_rtt_s, delay_s[a, b] + delay_s[b, a])
    return float(MATCHMAKING_ROUND_TRIPS * slowest_rtt_s + slowest_s)


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
    pipeline_s = 0.0
    for pipe in pipelines:
        hops = list(itertools.pairwise(pipe))
        forward = pass_time_s(
            [delay_s[a, b] for a, b in hops], [rate_bps[a, b] for a, b in hops], traffic
        )
        backward = pass_time_s(
            [delay_s[b, a] for a, b in hops[::-1]],
            [rate_bps[b, a] for a, b in hops[::-1]],
            traffic,
        )
        pipeline_s = max(pipeline_s, forward + backward)
    groups = tuple(
        group_averaging_s(
            delay_s, rate_bps, [pipe[s] for pipe in pipelines], traffic.stage_gradient_bytes[s]
        )
        for s in range(stages)
    )
    return StepTime(float(pipeline_s), max(groups), groups)
