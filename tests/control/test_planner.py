import numpy as np

from p2ptrain.control.links import Link
from p2ptrain.control.planner import (
    build_matrices,
    compute_plan,
    drifted,
    placement_cost,
    worth_switching,
)

PEERS = [f"p{i}" for i in range(8)]


def test_unmeasured_links_get_the_median_of_measured_ones():
    links = {("p0", "p1"): Link(2.0, 1000.0, 0.0), ("p0", "p2"): Link(6.0, None, 0.0)}
    m = build_matrices(PEERS[:3], links)
    assert m.delay_ms[0, 1] == m.delay_ms[1, 0] == 1.0  # RTT/2
    assert m.delay_ms[1, 2] == 2.0  # median of 1 and 3
    assert m.bandwidth_gbps[0, 1] == 1.0 and m.bandwidth_gbps[0, 2] == 1.0
    assert m.num_measured_delays == 2
    assert np.all(np.diag(m.delay_ms) == 0)


def test_plan_uses_every_peer_at_most_once():
    rng = np.random.default_rng(0)
    links = {
        (a, b): Link(float(rng.uniform(0.2, 20)), float(rng.uniform(50, 5000)), 0.0)
        for i, a in enumerate(PEERS)
        for b in PEERS[i + 1 :]
    }
    plan = compute_plan(build_matrices(PEERS, links), stages=3, c_dp_gb=0.5, c_pp_gb=0.05)
    used = [p for pipeline in plan.pipelines for p in pipeline] + list(plan.spares)
    assert sorted(used) == PEERS
    assert plan.stages == 3 and len(plan.pipelines) == 2 and len(plan.spares) == 2
    assert plan.cost_s > 0


def test_fewer_peers_than_stages_shrinks_the_pipeline():
    plan = compute_plan(build_matrices(PEERS[:2], {}), stages=4, c_dp_gb=0.5, c_pp_gb=0.05)
    assert plan.stages == 2 and len(plan.pipelines) == 1


def test_drift_needs_many_links_to_move():
    base = {(a, b): Link(1.0, 1000.0, 0.0) for i, a in enumerate(PEERS) for b in PEERS[i + 1 :]}
    old = build_matrices(PEERS, base)
    one_moved = dict(base)
    one_moved[("p0", "p1")] = Link(50.0, 1000.0, 0.0)
    assert not drifted(old, build_matrices(PEERS, one_moved))
    all_moved = {k: Link(10.0, 1000.0, 0.0) for k in base}
    assert drifted(old, build_matrices(PEERS, all_moved))


def test_placement_cost_prices_a_given_placement_on_new_measurements():
    # 4 peers, 2 stages x 2 replicas; every link 2 ms RTT (1 ms one way) at 1 Gbit/s
    peers = PEERS[:4]
    links = {(a, b): Link(2.0, 1000.0, 0.0) for i, a in enumerate(peers) for b in peers[i + 1 :]}
    m = build_matrices(peers, links)
    cost = placement_cost(m, [["p0", "p1"], ["p2", "p3"]], c_dp_gb=0.5, c_pp_gb=0.05)
    # DP: 2 * (1 ms + 0.5 GB * 8 / (2 replicas * 1 Gbit/s)) = 4.002 s; PP: 1 ms + 0.4 s, x2
    assert cost is not None and abs(cost - (4.002 + 2 * 0.401)) < 1e-9
    assert placement_cost(m, [["p0", "gone"], ["p2", "p3"]], 0.5, 0.05) is None


def test_a_drift_re_plan_must_clearly_beat_the_current_placement():
    assert worth_switching(0.5, 1.0)
    assert not worth_switching(0.9, 1.0)  # 10% better does not pay a swarm-wide restart
    assert worth_switching(3.0, None)  # nothing to compare with
