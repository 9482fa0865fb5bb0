import dataclasses

import numpy as np
import pytest

from p2ptrain.control.links import Link
from p2ptrain.control.planning.drift import (
    DRIFT_CHECK_INTERVAL_S,
    DRIFT_DWELL_S,
    MAX_DRIFT_CHECK_INTERVAL_S,
    SAMPLED_DRIFT_DWELL_S,
    DriftWatch,
    links_drifted,
)
from p2ptrain.control.planning.placement import worth_switching
from p2ptrain.control.planning.planner import (
    PLAN_MAX_EVALUATIONS,
    Matrices,
    build_matrices,
    compute_plan,
    network_facts,
    placement_cost,
)
from p2ptrain.records import LinkFacts, RunSpec
from p2ptrain.schedule.workload import measured_workload

PEERS = [f"p{i}" for i in range(8)]
# the hand-set volumes some tests price with (the run's own are much smaller)
SPEC = RunSpec().replace(stages=3, c_dp_gb=0.5, c_pp_gb=0.05)


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
    plan = compute_plan(build_matrices(PEERS, links), SPEC)
    used = [p for pipeline in plan.pipelines for p in pipeline] + list(plan.spares)
    assert sorted(used) == PEERS
    assert plan.stages == 3 and len(plan.pipelines) == 2 and len(plan.spares) == 2
    assert plan.cost_s > 0


def test_fewer_peers_than_stages_shrinks_the_pipeline():
    plan = compute_plan(build_matrices(PEERS[:2], {}), SPEC.replace(stages=4))
    assert plan.stages == 2 and len(plan.pipelines) == 1


def test_drift_needs_many_links_to_move():
    base = {(a, b): Link(1.0, 1000.0, 0.0) for i, a in enumerate(PEERS) for b in PEERS[i + 1 :]}
    one_moved = dict(base)
    one_moved[("p0", "p1")] = Link(50.0, 1000.0, 0.0)
    assert not links_drifted(base, one_moved)
    all_moved = {k: Link(10.0, 1000.0, 0.0) for k in base}
    assert links_drifted(base, all_moved)
    slower = {k: Link(1.0, 100.0, 0.0) for k in base}  # rates count as much
    assert links_drifted(base, slower)
    # keyed the other way round, the same pairs
    assert links_drifted({(b, a): link for (a, b), link in base.items()}, all_moved)
    # links measured only now (a sampled swarm's fresh probes) are nothing to compare
    assert not links_drifted({}, all_moved)
    # a probe that now fails is a move; a rate never measured before is not
    failing = {k: Link(None, None, 0.0, rtt_failed=True, rate_failed=True) for k in base}
    assert links_drifted(base, failing)
    unrated = {k: Link(1.0, None, 0.0) for k in base}
    assert not links_drifted(unrated, base)


def test_placement_cost_prices_a_given_placement_on_new_measurements():
    # 4 peers, 2 stages x 2 replicas; every link 2 ms RTT (1 ms one way) at 1 Gbit/s
    peers = PEERS[:4]
    links = {(a, b): Link(2.0, 1000.0, 0.0) for i, a in enumerate(peers) for b in peers[i + 1 :]}
    m = build_matrices(peers, links)
    cost = placement_cost(m, [["p0", "p1"], ["p2", "p3"]], SPEC)
    # DP: 2 * (1 ms + 0.5 GB * 8 / (2 replicas * 1 Gbit/s)) = 4.002 s; PP: 1 ms + 0.4 s, x2
    assert cost is not None and abs(cost - (4.002 + 2 * 0.401)) < 1e-9
    assert placement_cost(m, [["p0", "gone"], ["p2", "p3"]], SPEC) is None


def test_a_drift_re_plan_must_clearly_beat_the_current_placement():
    assert worth_switching(0.5, 1.0)
    assert not worth_switching(0.9, 1.0)  # 10% better does not pay a swarm-wide restart
    assert worth_switching(3.0, None)  # nothing to compare with


def _uniform_links(
    peers: list[str], rtt_ms: float, rate_mbps: float
) -> dict[tuple[str, str], Link]:
    return {
        (a, b): Link(rtt_ms, rate_mbps, 0.0) for i, a in enumerate(peers) for b in peers[i + 1 :]
    }


def _uniform(peers: list[str], rtt_ms: float, rate_mbps: float) -> Matrices:
    return build_matrices(peers, _uniform_links(peers, rtt_ms, rate_mbps))


def test_plans_are_priced_with_the_run_s_real_traffic_unless_overridden() -> None:
    m = _uniform(PEERS[:4], 2.0, 1000.0)
    pipelines = [["p0", "p1"], ["p2", "p3"]]
    run = RunSpec().replace(stages=2)  # c_dp_gb = c_pp_gb = 0: from the model and wire format
    real = measured_workload(run, 2, 2)
    assert 0 < real.c_dp_gb < 0.01 and 0 < real.c_pp_gb < 0.001  # the default model is small
    # the cost model's price with those volumes (paper cost: DP + 2 x PP, one-way delay 1 ms)
    dp_s = 2 * (1e-3 + real.c_dp_gb * 8 / (2 * 1.0))
    pp_s = 1e-3 + real.c_pp_gb * 8 / 1.0
    assert placement_cost(m, pipelines, run) == pytest.approx(dp_s + 2 * pp_s, rel=1e-9)
    overridden = run.replace(c_dp_gb=0.5)  # an explicit volume wins; the other stays real
    dp_s = 2 * (1e-3 + 0.5 * 8 / (2 * 1.0))
    assert placement_cost(m, pipelines, overridden) == pytest.approx(dp_s + 2 * pp_s, rel=1e-9)


def test_random_placement_is_seeded_and_ignores_arrival_order() -> None:
    rng = np.random.default_rng(1)
    links = {
        (a, b): Link(float(rng.uniform(0.2, 20)), float(rng.uniform(50, 5000)), 0.0)
        for i, a in enumerate(PEERS)
        for b in PEERS[i + 1 :]
    }
    run = RunSpec().replace(stages=3, placement="random", placement_seed=4)
    a = compute_plan(build_matrices(PEERS, links), run)
    b = compute_plan(build_matrices(list(reversed(PEERS)), links), run)
    assert (a.pipelines, a.spares) == (b.pipelines, b.spares)
    assert a.stages == 3 and len(a.pipelines) == 2 and len(a.spares) == 2
    assert sorted([*(p for pipe in a.pipelines for p in pipe), *a.spares]) == PEERS
    assert a.cost_s == pytest.approx(placement_cost(build_matrices(PEERS, links), a.pipelines, run))
    others = {
        compute_plan(build_matrices(PEERS, links), run.replace(placement_seed=s)).pipelines
        for s in range(6)
    }
    assert len(others) > 1  # the seed matters
    scheduled = compute_plan(build_matrices(PEERS, links), run.replace(placement="scheduled"))
    assert scheduled.cost_s <= a.cost_s


def test_the_live_search_is_bounded_by_evaluations(monkeypatch: pytest.MonkeyPatch) -> None:
    from p2ptrain.control.planning import planner
    from p2ptrain.schedule import plan_swarm
    from p2ptrain.schedule.synthetic import city_topology
    from p2ptrain.schedule.workload import planning_workload

    run = RunSpec().replace(stages=4)
    for num_peers, budgets in ((16, (1_000, PLAN_MAX_EVALUATIONS)), (32, (1_000,))):
        cities = city_topology(num_peers, 4, num_peers // 4, seed=0)
        topology = dataclasses.replace(cities, workload=planning_workload(run, 4, num_peers // 4))
        m = Matrices(list(topology.peers), topology.delay_ms, topology.bandwidth_gbps, 0)
        for budget in budgets:
            monkeypatch.setattr(planner, "PLAN_MAX_EVALUATIONS", budget)
            live = compute_plan(m, run)
            alone = plan_swarm(topology, 4, num_peers // 4, max_evaluations=budget)
            names = tuple(tuple(topology.peers[i] for i in row) for row in alone.pipelines)
            assert live.pipelines == names
            # the default budget lets a 16-peer plan converge: the budget only cuts big swarms
            if num_peers == 16 and budget == PLAN_MAX_EVALUATIONS:
                assert alone.stopped == "converged"
            if budget == 1_000:
                assert alone.stopped == "evaluation_budget"


def test_the_plan_states_each_group_s_and_each_hop_s_links() -> None:
    # 4 peers, 2 stages x 2 replicas: p0-p2 and p1-p3 are the groups, p0-p1 and p2-p3 the hops
    rtt_ms = {("p0", "p1"): 10.0, ("p2", "p3"): 40.0, ("p0", "p2"): 4.0, ("p1", "p3"): 80.0}
    rates = {("p0", "p1"): 500.0, ("p2", "p3"): 50.0, ("p0", "p2"): 900.0, ("p1", "p3"): 20.0}
    peers = PEERS[:4]
    links = {
        (a, b): Link(rtt_ms.get((a, b), 200.0), rates.get((a, b), 5.0), 0.0)
        for i, a in enumerate(peers)
        for b in peers[i + 1 :]
    }
    facts = network_facts(build_matrices(peers, links), [["p0", "p1"], ["p2", "p3"]])
    assert facts is not None
    # the worst of the used pairs: the cross links p0-p3 and p1-p2 (200 ms, 5 Mbit/s) carry
    # nothing, so they stretch no timeout (issue 26.3)
    assert (facts.max_rtt_s, facts.min_rate_mbps) == (0.08, 20.0)
    assert facts.groups == (LinkFacts(0.004, 900.0), LinkFacts(0.08, 20.0))
    assert facts.hops == ((LinkFacts(0.01, 500.0),), (LinkFacts(0.04, 50.0),))
    one_pipeline = network_facts(build_matrices(peers[:2], links), [["p0", "p1"]])
    assert one_pipeline is not None and one_pipeline.groups == (one_pipeline.swarm,) * 2
    assert network_facts(build_matrices(peers[:1], links), [["p0"]]) is None


def test_the_search_runs_in_its_own_process_with_the_same_plan() -> None:
    import os

    import trio

    from p2ptrain.control.planning import search_process

    peers = [f"p{i}" for i in range(6)]
    links = {
        (a, b): Link(2.0 + i + j, 100.0 / (1 + i), 0.0)
        for i, a in enumerate(peers)
        for j, b in enumerate(peers)
        if a < b
    }
    matrices = build_matrices(peers, links)
    run = RunSpec().replace(stages=2, n_layer=4)
    placed = trio.run(search_process.compute_plan, matrices, run)
    assert placed == compute_plan(matrices, run)
    child = search_process.pid()
    assert child is not None and child != os.getpid()  # not this process's thread


def test_no_drift_re_plan_within_the_dwell_of_the_last_plan() -> None:
    """Noisy links make every fresh search beat the current placement priced on the new noise
    (32 peers on one loaded machine switched every 10 s): a drift re-plan waits DRIFT_DWELL_S."""
    watch = DriftWatch()
    before, after = _uniform_links(PEERS[:4], 2.0, 1000.0), _uniform_links(PEERS[:4], 40.0, 10.0)
    watch.planned(before, 100.0)
    assert not watch.drifted(100.0 + DRIFT_DWELL_S / 2, after, PEERS[:4], None)
    assert watch.drifted(100.0 + DRIFT_DWELL_S + 1.0, after, PEERS[:4], None)


def test_a_swarm_past_the_full_mesh_dwells_longer_after_a_plan() -> None:
    """Its plans are confirmed on their own links, and a switch restarts more sessions."""
    from p2ptrain.control.estimate.book import FULL_MESH_PEERS

    peers = [f"Peer{i:03d}" for i in range(FULL_MESH_PEERS + 1)]
    watch = DriftWatch()
    before, after = _uniform_links(peers, 2.0, 1000.0), _uniform_links(peers, 40.0, 10.0)
    watch.planned(before, 100.0)
    assert not watch.drifted(100.0 + SAMPLED_DRIFT_DWELL_S - 1.0, after, peers, None)
    assert watch.drifted(100.0 + SAMPLED_DRIFT_DWELL_S + 1.0, after, peers, None)


def test_fruitless_drift_checks_back_off_until_the_next_plan() -> None:
    """On noisy links every check drifts and each is a search: one that found nothing worth
    switching to doubles the wait for the next (up to MAX_DRIFT_CHECK_INTERVAL_S)."""
    watch = DriftWatch()
    members = PEERS[:4]
    before, after = _uniform_links(members, 2.0, 1000.0), _uniform_links(members, 40.0, 10.0)
    watch.planned(before, 0.0)
    t = DRIFT_DWELL_S + 1.0
    assert watch.drifted(t, after, members, None)
    assert not watch.drifted(t + DRIFT_CHECK_INTERVAL_S / 2, after, members, None)
    assert watch.drifted(t + DRIFT_CHECK_INTERVAL_S, after, members, None)  # the usual pace
    assert not watch.drifted(t + 2 * DRIFT_CHECK_INTERVAL_S, before, members, None)  # no drift
    t += 2 * DRIFT_CHECK_INTERVAL_S
    watch.back_off()
    assert not watch.drifted(t + DRIFT_CHECK_INTERVAL_S, after, members, None)
    assert watch.drifted(t + 2 * DRIFT_CHECK_INTERVAL_S, after, members, None)
    for _ in range(10):
        watch.back_off()
    assert watch.check_interval_s == MAX_DRIFT_CHECK_INTERVAL_S


def test_made_up_peers_in_a_members_row_cannot_hide_a_drift():
    """A row may name up to 1,024 peers: a member's steady links to made-up ones diluted every
    honest link's drift below the fraction; only the planned members' links count."""
    base = {(a, b): Link(1.0, 1000.0, 0.0) for i, a in enumerate(PEERS) for b in PEERS[i + 1 :]}
    fake = {("p0", f"fake{n}"): Link(1.0, 1000.0, 0.0) for n in range(1000)}
    worse = {k: Link(6.0, 100.0, 0.0) for k in base}
    assert not links_drifted({**base, **fake}, {**worse, **fake})  # what the planner saw
    assert links_drifted({**base, **fake}, {**worse, **fake}, among=PEERS)
