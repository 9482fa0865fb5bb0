"""`p2ptrain local`'s plan on one machine (issue 28): its peers share the host's cores, so the
planner prices their links only, at the run's stages, and the plan shows pipelines and
data-parallel replicas under either sync. Priced as separate machines, diloco's planner would
make every peer a one-stage replica (no pipeline left to show)."""

from __future__ import annotations

import numpy as np
import pytest

from p2ptrain.control.planning.compute import peer_compute
from p2ptrain.control.planning.planner import Matrices, Placement, compute_plan
from p2ptrain.harness.cli.local_cmd import one_host_spec, shared_cores_note
from p2ptrain.records import RunSpec, StageCompute

PEERS = [f"peer-{i}" for i in range(4)]


def plan_on_loopback(run: RunSpec) -> Placement:
    """4 peers on 127.0.0.1 as the control plane measures them, each worker's model timed."""
    n = len(PEERS)
    measured = {p: StageCompute(0.002, 0.0002, 0.001, 8, "cpu", run.run_id, 0) for p in PEERS}
    matrices = Matrices(
        PEERS,
        np.full((n, n), 0.05) - np.diag(np.full(n, 0.05)),
        np.full((n, n), 10.0),
        num_measured_delays=n * (n - 1) // 2,
        compute=peer_compute(PEERS, measured, run),
    )
    return compute_plan(matrices, run)


@pytest.mark.parametrize("sync", ["step", "diloco"])
def test_one_host_plans_pipelines_and_replicas(sync: str) -> None:
    run = RunSpec().replace(sync=sync, inner_steps=10, min_peers=4)
    placement = plan_on_loopback(one_host_spec(run))
    assert placement.stages == 2 and [len(p) for p in placement.pipelines] == [2, 2]
    assert not placement.spares


def test_priced_as_separate_machines_diloco_drops_the_pipeline() -> None:
    """Why one_host_spec exists: the compute-aware diloco planner's choice for these peers."""
    run = RunSpec().replace(sync="diloco", inner_steps=10, min_peers=4)
    assert plan_on_loopback(run).stages == 1


def test_the_note_says_the_planner_prices_the_links_only() -> None:
    assert "prices the links only" in shared_cores_note(4)
