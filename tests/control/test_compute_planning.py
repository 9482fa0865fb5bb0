import dataclasses

import numpy as np

from p2ptrain.control.compute import measured_peers, peer_compute
from p2ptrain.control.links import Link
from p2ptrain.control.planner import build_matrices, compute_plan
from p2ptrain.records import RunSpec, StageCompute

RUN = RunSpec(stages=2, n_layer=4)


def timed(block_row_s: float, run_id: str = RUN.run_id) -> StageCompute:
    return StageCompute(block_row_s, block_row_s / 10, block_row_s / 2, 8, "cpu", run_id)


def test_records_become_the_compute_vector_with_gaps_filled() -> None:
    peers = ["a", "b", "c", "d"]
    measured = {"a": timed(0.01), "b": None, "c": timed(0.03), "d": timed(9.0, "other-run")}
    compute = peer_compute(peers, measured, RUN)
    assert compute is not None
    # b never measured and d timed another run's model: both get the median of a and c
    assert compute.filled().block_row_s.tolist() == [0.01, 0.02, 0.03, 0.02]
    assert measured_peers(peers, measured) == {"a", "c", "d"}
    assert peer_compute(peers, measured, RUN.replace(compute_aware=False)) is None
    assert peer_compute(peers, {}, RUN) is None  # nothing measured: the paper's cost


def test_compute_aware_planner_leaves_slow_peers_out_when_it_pays() -> None:
    # 6 equal links, 2 stages: blind, 3 replicas use everyone; the two peers 8x slower gate
    # every step, so the compute-aware plan trains 2 replicas on the 4 fast peers
    peers = [f"p{i}" for i in range(6)]
    links = {
        (a, b): Link(2.0, 1000.0, 0.0)
        for i, a in enumerate(peers) for b in peers[i + 1 :]
    }  # fmt: skip
    matrices = build_matrices(peers, links)
    blind = compute_plan(matrices, RUN)
    assert len(blind.pipelines) == 3 and not blind.spares
    measured = {p: timed(0.08 if p in ("p1", "p4") else 0.01) for p in peers}
    aware_matrices = dataclasses.replace(matrices, compute=peer_compute(peers, measured, RUN))
    aware = compute_plan(aware_matrices, RUN)
    assert aware.stages == 2 and sorted(aware.spares) == ["p1", "p4"]
    assert np.isfinite(aware.cost_s)
