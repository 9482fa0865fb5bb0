"""The peers' measured stage times, for the planner (when the run spec's compute_aware is set).

Each worker times the run's model once (worker/compute_probe.py) and its node announces it in its
peer record; here those records become the scheduler's per-peer compute vector. A peer that has
not measured yet gets the median of those that did (schedule/compute.py), like an unmeasured link.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from p2ptrain.records import RunSpec, StageCompute

if TYPE_CHECKING:
    from p2ptrain.schedule.compute import PeerCompute


def peer_compute(
    peers: list[str], measured: Mapping[str, StageCompute | None], run: RunSpec
) -> PeerCompute | None:
    """The compute vector of `peers` in that order; None (the paper's communication-only cost)
    when the run is not compute-aware or no peer has timed this run's model yet."""
    from p2ptrain.schedule.compute import PeerCompute

    if not run.compute_aware:
        return None
    times = np.full((3, len(peers)), np.nan)
    for i, peer in enumerate(peers):
        compute = measured.get(peer)
        if compute is not None and compute.run_id == run.run_id:
            times[:, i] = (compute.block_row_s, compute.embed_row_s, compute.head_row_s)
    if np.isnan(times[0]).all():
        return None
    memory = np.array([_memory(measured.get(peer), run) for peer in peers], dtype=float)
    return PeerCompute(
        times[0], times[1], times[2], run.n_layer, run.batch_size, run.micro_batches,
        memory_bytes=memory, stage_bytes=RunStageBytes(run),
    )  # fmt: skip


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
    travels to the search process (control/search_process.py) pickled."""

    run: RunSpec

    def __call__(self, stages: int, replicas: int, sizes: Sequence[int]) -> list[float]:
        from p2ptrain.schedule.memory import stage_memory

        run, config = self.run, self.run.model_config()
        rows = math.ceil(math.ceil(run.batch_size / replicas) / run.micro_batches)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        return [
            float(stage_memory(config, range(starts[j], starts[j + 1]), rows,
                               run.micro_batches).total_bytes)
            for j in range(stages)
        ]  # fmt: skip


def measured_peers(peers: list[str], measured: Mapping[str, StageCompute | None]) -> frozenset[str]:
    """Which of `peers` have a measurement: a new one is worth a re-plan."""
    return frozenset(p for p in peers if measured.get(p) is not None)
