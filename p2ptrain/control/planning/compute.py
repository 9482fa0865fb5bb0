"""The peers' measured stage times, for the planner (when the run spec's compute_aware is set).

Each worker times the run's model once (worker/compute_probe.py) and its node announces it in its
peer record; here those records become the scheduler's per-peer compute vector. A peer that has
not measured yet gets the median of those that did (schedule/compute.py), like an unmeasured link.

A peer's word on its speed is evidence, not authority (issue 26.9): no claim counts for less
than the run's model takes on a device of MAX_DEVICE_FLOPS, and a peer whose pipeline steps run
REPRICE_AFTER times slower than its plan predicted is priced that much slower (ComputeTrust).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from p2ptrain.records import PeerMetrics, Plan, RunSpec, StageCompute

if TYPE_CHECKING:
    from p2ptrain.schedule.compute import PeerCompute


# dense FLOP/s no single device reaches (the fastest GPUs of 2025 do ~2-5e15 in 16 or 8 bits):
# a claim faster than this on the run's model is a lie, priced at this speed
MAX_DEVICE_FLOPS = 1e16
# a pipeline whose steps run this many times slower than its plan predicted re-prices its peers
REPRICE_AFTER = 1.5
MAX_REPRICE = 1e3  # the most a peer's claimed times are multiplied by
# a plan is judged this long after it was first seen: the steps reported before are older plans'
JUDGE_AFTER_S = 60.0


def fastest_row_s(run: RunSpec) -> tuple[float, float, float]:
    """The least seconds per row (block, embedding, head) any device may claim on the run's
    model: forward and backward of each parameter, 6 FLOP per token, at MAX_DEVICE_FLOPS."""
    from p2ptrain.schedule.memory import block_parameters, head_parameters

    config = run.model_config()
    per_param_s = 6 * config.block_size / MAX_DEVICE_FLOPS
    # the embedding is a lookup, not a product: only the record's floor holds it
    return block_parameters(config) * per_param_s, 0.0, head_parameters(config) * per_param_s


def peer_compute(
    peers: list[str],
    measured: Mapping[str, StageCompute | None],
    run: RunSpec,
    slowdown: Mapping[str, float] | None = None,
) -> PeerCompute | None:
    """The compute vector of `peers` in that order; None (the paper's communication-only cost)
    when the run is not compute-aware or no peer has timed this run's model yet. No claim is
    faster than fastest_row_s; `slowdown` (ComputeTrust.factors) multiplies a peer's times."""
    from p2ptrain.schedule.compute import PeerCompute

    if not run.swarm.compute_aware:
        return None
    floor = np.array(fastest_row_s(run))
    times = np.full((3, len(peers)), np.nan)
    for i, peer in enumerate(peers):
        compute = measured.get(peer)
        if compute is not None and compute.run_id == run.run_id:
            claimed = np.array((compute.block_row_s, compute.embed_row_s, compute.head_row_s))
            factor = (slowdown or {}).get(peer, 1.0)
            times[:, i] = np.maximum(claimed, floor) * factor
    if np.isnan(times[0]).all():
        return None
    memory = np.array([_memory(measured.get(peer), run) for peer in peers], dtype=float)
    return PeerCompute(
        times[0],
        times[1],
        times[2],
        run.model.n_layer,
        run.optim.batch_size,
        run.optim.micro_batches,
        memory_bytes=memory,
        stage_bytes=RunStageBytes(run),
        batch_per_replica=run.optim.sync == "diloco",
    )


def _memory(compute: StageCompute | None, run: RunSpec) -> float:
    """A peer's device memory for this run's plans (NaN: not known)."""
    if compute is None or compute.run_id != run.run_id or compute.memory_bytes <= 0:
        return float("nan")
    return float(compute.memory_bytes)


@dataclass(frozen=True)
class RunStageBytes:
    """What each stage of a (stages, replicas, blocks per stage) plan of `run` needs to train
    (schedule/memory.py): its weights, gradients, AdamW state and the activations of its
    replica's micro-batches (the largest replica's, rounded up). A class, not a closure: it
    travels to the search process (control/planning/search_process.py) pickled."""

    run: RunSpec

    def __call__(self, stages: int, replicas: int, sizes: Sequence[int]) -> list[float]:
        from p2ptrain.schedule.memory import stage_memory
        from p2ptrain.schedule.workload import replica_batch_rows

        run, config = self.run, self.run.model_config()
        rows = math.ceil(math.ceil(replica_batch_rows(run, replicas)) / run.optim.micro_batches)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        return [
            float(
                stage_memory(
                    config, range(starts[j], starts[j + 1]), rows, run.optim.micro_batches
                ).total_bytes
            )
            for j in range(stages)
        ]


def measured_peers(peers: list[str], measured: Mapping[str, StageCompute | None]) -> frozenset[str]:
    """Which of `peers` have a measurement: a new one is worth a re-plan."""
    return frozenset(p for p in peers if measured.get(p) is not None)


class ComputeTrust:
    """Per-peer factors on claimed compute, learnt from the step times the plan's trainers
    report (telemetry): where a pipeline's slowest reported step is REPRICE_AFTER times the
    plan's predicted step or more, each of its peers' times are multiplied by that ratio, once
    per plan. The next plan's prediction then holds the factor, so it does not compound while
    that plan runs as predicted. The slowest report counts: a peer cannot hide its pipeline's
    pace by reporting fast steps of its own."""

    def __init__(self) -> None:
        self.factors: dict[str, float] = {}
        self._judged: set[tuple[int, int]] = set()
        self._first_seen: tuple[tuple[int, int], float] | None = None

    def observe(
        self, plan: Plan | None, metrics: Mapping[str, PeerMetrics | None], now: float
    ) -> bool:
        """Judge `plan` on the latest step each of its trainers reported (as placed by it),
        JUDGE_AFTER_S after it was first seen; True if some peer was re-priced (once a plan)."""
        if plan is None or not plan.predicted_step_s or plan.key in self._judged:
            return False
        if self._first_seen is None or self._first_seen[0] != plan.key:
            self._first_seen = (plan.key, now)
        if now - self._first_seen[1] < JUDGE_AFTER_S:
            return False
        slow: dict[str, float] = {}
        for replica, pipeline in enumerate(plan.pipelines):
            steps = [
                m.step_s
                for stage, peer in enumerate(pipeline)
                if (m := metrics.get(peer)) is not None
                and m.step_s is not None
                and (m.stage, m.replica) == (stage, replica)
            ]
            if len(steps) < len(pipeline):
                return False  # judged once every trainer of the plan has stepped under it
            ratio = max(steps) / plan.predicted_step_s
            if ratio >= REPRICE_AFTER:
                slow.update((peer, ratio) for peer in pipeline)
        self._judged.add(plan.key)
        for peer, ratio in slow.items():
            self.factors[peer] = min(MAX_REPRICE, self.factors.get(peer, 1.0) * ratio)
        return bool(slow)
