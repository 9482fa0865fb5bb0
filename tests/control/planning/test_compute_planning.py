import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import trio

from p2ptrain.control.links import Link
from p2ptrain.control.planning.compute import peer_compute
from p2ptrain.control.planning.first_wait import FIRST_PLAN_WAIT_S
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.control.planning.planner import build_matrices, compute_plan, placement_cost
from p2ptrain.control.planning.trust import measured_peers
from p2ptrain.control.view import SwarmView
from p2ptrain.records import RunSpec, StageCompute
from tests.control.test_view import A, B, C, make_view, record

RUN = RunSpec().replace(stages=2, n_layer=4)


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
    links = {(a, b): Link(2.0, 1000.0, 0.0) for i, a in enumerate(peers) for b in peers[i + 1 :]}
    matrices = build_matrices(peers, links)
    blind = compute_plan(matrices, RUN)
    assert len(blind.pipelines) == 3 and not blind.spares
    measured = {p: timed(0.08 if p in ("p1", "p4") else 0.01) for p in peers}
    aware_matrices = dataclasses.replace(matrices, compute=peer_compute(peers, measured, RUN))
    aware = compute_plan(aware_matrices, RUN)
    assert aware.stages == 2 and sorted(aware.spares) == ["p1", "p4"]
    assert np.isfinite(aware.cost_s)


def test_the_live_planner_splits_the_layers_around_slower_peers() -> None:
    # 4 peers on equal links, 2 of them 2.5x slower (within the cuts: all are placed); the
    # slow ones share a stage, which gets fewer of the 8 layers
    run = RunSpec().replace(stages=2, n_layer=8)
    peers = ["p0", "p1", "p2", "p3"]
    links = {(a, b): Link(2.0, 1000.0, 0.0) for i, a in enumerate(peers) for b in peers[i + 1 :]}
    matrices = build_matrices(peers, links)
    measured = {p: timed(0.025 if p in ("p1", "p3") else 0.01) for p in peers}
    aware_matrices = dataclasses.replace(matrices, compute=peer_compute(peers, measured, run))
    aware = compute_plan(aware_matrices, run)
    assert len(aware.pipelines) == 2 and not aware.spares
    slow_stage = 0 if aware.pipelines[0][0] in ("p1", "p3") else 1
    assert {row[slow_stage] for row in aware.pipelines} == {"p1", "p3"}
    assert sum(aware.stage_layers) == 8 and aware.stage_layers[slow_stage] < 4
    priced = placement_cost(aware_matrices, aware.pipelines, run, aware.stage_layers)
    even = placement_cost(aware_matrices, aware.pipelines, run)
    assert priced == pytest.approx(aware.cost_s) and even is not None and priced < even
    assert compute_plan(aware_matrices, run) == aware  # deterministic
    # compute-blind: the model's even cut
    assert compute_plan(matrices, run).stage_layers == ()


def trainer(peer: str) -> dict[str, Any]:
    """A trainer's record with its data-plane address (a first plan waits for it)."""
    address = f"/ip4/10.0.0.{ord(peer[-1]) % 200}/tcp/7402"  # and no saved state of the run
    return {**record("trainer"), "data_addrs": [address], "saved": []}


def measured_link(peer: str) -> dict[str, Any]:
    """Telemetry measuring the link to `peer` (a first plan waits for every trainers' link)."""
    link = {"rtt_ms": 20.0, "rtt_age_s": 0.5, "bandwidth_mbps": 50.0, "bandwidth_age_s": 0.5}
    return {"links": {peer: link}}


def _ticks(maker: PlanMaker, times: list[float], alive: Callable[[float], None]) -> list[bool]:
    """The planner's tick at each time, every member heard from just before."""

    async def ticks() -> list[bool]:
        outcomes = []
        for now in times:
            alive(now)
            outcomes.append(await maker.tick(now, []))
        return outcomes

    return trio.run(ticks)


def test_a_compute_aware_first_plan_waits_for_every_trainers_timed_stage() -> None:
    v, feed = make_view(me=A, peers=(B, C))
    v.run = RunSpec().replace(stages=1, n_layer=2, min_peers=2)
    timed_b = {**trainer(B), "stage_compute": timed(0.01, v.run.run_id).to_dict()}
    records = {B: timed_b, C: trainer(C)}  # C has not timed the run's model yet

    def alive(now: float) -> None:
        for peer, body in records.items():
            assert v.accept(feed("peer", peer, body), now) is None
        assert v.accept(feed("telemetry", B, measured_link(C)), now) is None

    v.claim()
    maker = PlanMaker(v, A)  # we are control-only: never placed beside trainers
    assert _ticks(maker, [1.0, 1.0 + PLAN_DEBOUNCE_S + 0.1, 5.0], alive) == [False] * 3
    assert v.plan is None
    records[C] = {**trainer(C), "stage_compute": timed(0.03, v.run.run_id).to_dict()}
    assert _ticks(maker, [6.0, 6.0 + PLAN_DEBOUNCE_S + 0.1], alive) == [False, True]
    assert v.plan is not None and v.plan.peers() == {B, C}


def test_the_first_plan_stops_waiting_for_a_peer_that_never_times_its_stage() -> None:
    for compute_aware in (True, False):
        v, feed = make_view(me=A, peers=(B,))
        v.run = RunSpec().replace(stages=1, n_layer=2, min_peers=1, compute_aware=compute_aware)

        def alive(now: float, v: SwarmView = v, feed: Any = feed) -> None:
            assert v.accept(feed("peer", B, trainer(B)), now) is None

        v.claim()
        maker = PlanMaker(v, A)
        if compute_aware:  # waits FIRST_PLAN_WAIT_S, then plans without B's time
            late = 1.0 + FIRST_PLAN_WAIT_S
            times = [1.0, 7.0, 13.0, 19.0, 25.0, late - 1.0, late, late + PLAN_DEBOUNCE_S + 0.1]
        else:  # a compute-blind run never waits
            times = [1.0, 1.0 + PLAN_DEBOUNCE_S + 0.1]
        outcomes = _ticks(maker, times, alive)
        assert outcomes == [False] * (len(times) - 1) + [True] and v.plan is not None


def _equal_links(peers: list[str]) -> dict[tuple[str, str], Link]:
    return {(a, b): Link(2.0, 1000.0, 0.0) for i, a in enumerate(peers) for b in peers[i + 1 :]}


def _with_memory(block_row_s: float, memory_bytes: float, run: RunSpec) -> StageCompute:
    return dataclasses.replace(
        timed(block_row_s, run.run_id), memory_bytes=int(memory_bytes), precision="fp32"
    )


def test_a_peer_never_gets_a_stage_its_device_cannot_hold() -> None:
    """Two peers hold only the smaller of the two stages (the last one carries the head and
    the logits of every micro-batch); on equal links and compute the search could put them
    anywhere: the memory-aware plan puts them on the stage they can hold."""
    from p2ptrain.control.planning.compute import RunStageBytes

    peers = ["p0", "p1", "p2", "p3"]
    need = RunStageBytes(RUN)(2, 2, [2, 2])
    small_stage = int(np.argmin(need))
    assert need[small_stage] < need[1 - small_stage]
    small = {"p0", "p2"}
    measured = {
        p: _with_memory(0.01, need[small_stage] * 1.01 if p in small else 1e12, RUN) for p in peers
    }
    matrices = dataclasses.replace(
        build_matrices(peers, _equal_links(peers)), compute=peer_compute(peers, measured, RUN)
    )
    plan = compute_plan(matrices, RUN)
    assert len(plan.pipelines) == 2 and not plan.spares
    assert {row[small_stage] for row in plan.pipelines} == small
    assert plan.predicted_step_s is not None and plan.predicted_step_s < 1e3


def test_a_swarm_whose_devices_cannot_hold_the_model_is_refused_with_a_reason() -> None:
    """The 1.3b preset in 2 stages needs about 9 GiB of weights, gradients and AdamW state a
    stage: four 4 GiB devices cannot hold it and the planner says so; 24 GiB devices can."""
    from p2ptrain.control.planning.placement import NoPlacementFits

    run = RunSpec().replace(stages=2, preset="1.3b", batch_size=4, micro_batches=2, block_size=64)
    peers = ["p0", "p1", "p2", "p3"]
    links = _equal_links(peers)

    def plan_with(memory_gib: float) -> Any:
        measured = {p: _with_memory(0.01, memory_gib * 2**30, run) for p in peers}
        matrices = dataclasses.replace(
            build_matrices(peers, links), compute=peer_compute(peers, measured, run)
        )
        return compute_plan(matrices, run)

    with pytest.raises(
        NoPlacementFits, match=r"memory \(stage \d .* needs \d\.\d+ GiB; peer p\d has 4.00"
    ):
        plan_with(4)
    fits = plan_with(24)  # (one pipeline: averaging a 1.3b stage's gradient costs more)
    assert fits.stages == 2 and len(fits.pipelines) >= 1


@pytest.mark.parametrize("aware", [False, True])
def test_two_peers_behind_nats_are_never_placed_next_to_each_other(aware: bool) -> None:
    """p1 and p3 report `private` (neither can dial the other, and there is no relay): in a
    2 x 2 plan each talks to its pipeline neighbour and its stage-mate, so they must sit in
    different pipelines and different stages: each next to public peers only."""
    from p2ptrain.control.planning.planner import UNREACHABLE_DELAY_MS

    peers = ["p0", "p1", "p2", "p3"]
    private = frozenset({"p1", "p3"})
    links = _equal_links(peers)
    del links[("p1", "p3")]  # they never measured each other
    matrices = build_matrices(peers, links, private)
    assert matrices.delay_ms[1, 3] == matrices.delay_ms[3, 1] == UNREACHABLE_DELAY_MS
    assert matrices.delay_ms[0, 1] == 1.0  # the others as measured (RTT 2 ms)
    if aware:
        measured = {p: timed(0.01) for p in peers}
        matrices = dataclasses.replace(matrices, compute=peer_compute(peers, measured, RUN))
    plan = compute_plan(matrices, RUN)
    assert len(plan.pipelines) == 2 and not plan.spares
    stage_of = {peer: s for pipe in plan.pipelines for s, peer in enumerate(pipe)}
    pipe_of = {peer: r for r, pipe in enumerate(plan.pipelines) for peer in pipe}
    assert stage_of["p1"] != stage_of["p3"] and pipe_of["p1"] != pipe_of["p3"], plan.pipelines
    assert plan.cost_s < 10  # no unreachable link priced in
    # the timeouts the plan carries are the usable links': 2 ms round trips, not 200 s
    from p2ptrain.control.planning.planner import network_facts

    facts = network_facts(matrices, plan.pipelines)
    assert facts is not None and facts.swarm.rtt_s == pytest.approx(0.002)


def test_the_first_plan_does_not_wait_for_a_link_two_nated_peers_cannot_have() -> None:
    from p2ptrain.control.planning.readiness import first_plan_gaps

    peers = ["p0", "p1", "p2"]
    roles: dict[str, str | None] = {p: "trainer" for p in peers}
    addrs = {p: ("/ip4/10.0.0.1/tcp/7402",) for p in peers}
    links = {("p0", "p1"): Link(2.0, 100.0, 0.0), ("p0", "p2"): Link(2.0, 100.0, 0.0)}
    run = RUN.replace(compute_aware=False)
    assert first_plan_gaps(peers, roles, addrs, links, {}, run) == ["1 of 3 links"]
    assert first_plan_gaps(peers, roles, addrs, links, {}, run, frozenset({"p1", "p2"})) == []


def test_a_relayed_link_is_priced_at_a_share_of_its_rate_and_kept_out_of_the_plan() -> None:
    """p1 and p3 reach each other through a relay (both behind NATs, one symmetric): their link
    counts at RELAYED_RATE_SHARE of what it measured, and a 2 x 2 plan, which uses 4 of the 6
    links, leaves it out (each is the other's diagonal: neither neighbour nor stage-mate)."""
    from p2ptrain.control.planning.planner import RELAYED_RATE_SHARE

    peers = ["p0", "p1", "p2", "p3"]
    links = _equal_links(peers)
    links[("p1", "p3")] = Link(2.0, 40.0, 0.0)  # slow, and relayed on top
    matrices = build_matrices(peers, links, relayed=frozenset({("p1", "p3")}))
    assert matrices.bandwidth_gbps[1, 3] == pytest.approx(RELAYED_RATE_SHARE * 0.04)
    assert matrices.bandwidth_gbps[0, 1] == pytest.approx(1.0)
    plan = compute_plan(matrices, RUN.replace(compute_aware=False))
    stage_of = {peer: s for pipe in plan.pipelines for s, peer in enumerate(pipe)}
    pipe_of = {peer: r for r, pipe in enumerate(plan.pipelines) for peer in pipe}
    assert stage_of["p1"] != stage_of["p3"] and pipe_of["p1"] != pipe_of["p3"], plan.pipelines


def test_natted_peers_with_relay_slots_are_routable_and_those_without_are_not() -> None:
    """The planner's `private` set (links it prices out between its members) holds the NATed
    peers with no relay slot only: two NATed peers connect if either holds one."""
    from p2ptrain.control.membership import Member
    from p2ptrain.control.planning.plan_inputs import unroutable
    from p2ptrain.records import PeerRecord

    base = PeerRecord.from_dict(record("trainer"))
    view, _ = make_view(A)
    view.members[B] = Member(dataclasses.replace(base, reachability="private", relays=(C,)), 0.0)
    view.members[C] = Member(dataclasses.replace(base, reachability="private"), 0.0)
    assert unroutable(view, [A, B, C], "public", ()) == frozenset({C})
    assert unroutable(view, [A, B, C], "private", ()) == frozenset({A, C})
    assert unroutable(view, [A, B, C], "private", (B,)) == frozenset({C})
