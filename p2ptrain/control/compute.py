"""The peers' measured stage times, for the planner (when the run spec's compute_aware is set).

Each worker times the run's model once (worker/compute_probe.py) and its node announces it in its
peer record; here those records become the scheduler's per-peer compute vector. A peer that has
not measured yet gets the median of those that did (schedule/compute.py), like an unmeasured link.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    return PeerCompute(times[0], times[1], times[2], run.n_layer, run.batch_size, run.micro_batches)


def measured_peers(peers: list[str], measured: Mapping[str, StageCompute | None]) -> frozenset[str]:
    """Which of `peers` have a measurement: a new one is worth a re-plan."""
    return frozenset(p for p in peers if measured.get(p) is not None)
