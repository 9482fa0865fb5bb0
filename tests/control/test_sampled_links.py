"""The live node's sampled measurement (issue 29): a bounded neighbour set in a big swarm, every
member in a small one; telemetry of neighbours only, with the coordinate and capacity; the first
plan on settled coordinates; the planner's matrix marking what is measured."""

from __future__ import annotations

import time
from typing import cast

import numpy as np
import pytest
import trio
from libp2p.abc import IHost

from p2ptrain.control.estimate.book import FULL_MESH_PEERS, plan_links, plan_partners
from p2ptrain.control.estimate.matrix import live_matrices
from p2ptrain.control.estimate.neighbours import ROTATE_RANDOM_S, NeighbourPolicy
from p2ptrain.control.links import Link
from p2ptrain.control.measuring import LinkProber
from p2ptrain.control.membership import Member
from p2ptrain.control.planning.planner import build_matrices
from p2ptrain.control.planning.readiness import first_plan_gaps
from p2ptrain.control.view import SwarmView
from p2ptrain.errors import WireError
from p2ptrain.records import PeerRecord, Plan, RunSpec, Telemetry
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate

ME = "Peer000"
MAX_NEIGHBOURS = NeighbourPolicy().max_size


def peers(n: int) -> list[str]:
    return [f"Peer{i:03d}" for i in range(n)]


def swarm_view(n: int) -> SwarmView:
    """Our view of a swarm of `n` live control-only members, ourselves (Peer000) included (the
    prober reads the monotonic clock)."""
    now = time.monotonic()
    view = SwarmView(self_id=ME, role="control-only", planner_capable=True, started_at=now)
    for peer in peers(n)[1:]:
        record = PeerRecord((), "control-only", True, "0", {})
        view.members[peer] = Member(record, last_heard=now)
    return view


def prober(view: SwarmView) -> LinkProber:
    return LinkProber(cast(IHost, None), view, trio.Event())  # the host probes; not used here


def coordinate(x: float, error: float = 0.1) -> NetCoordinate:
    return NetCoordinate((x, 0.0, 0.0), 1.0, error)


def test_a_small_swarm_measures_every_member_as_before() -> None:
    view = swarm_view(FULL_MESH_PEERS)
    probes = prober(view)
    chosen = {probes._stalest_peer("rtt", lambda s: s.rtt_at) for _ in range(40)}
    assert chosen == set(peers(FULL_MESH_PEERS)[1:])
    assert not view.links.estimate.sampled


def test_a_big_swarm_probes_a_bounded_neighbour_set_with_the_plan_partners() -> None:
    view = swarm_view(64)
    members = peers(64)
    view.plan = Plan(
        1, 1, "Peer001", 2, ((ME, members[40]), (members[50], members[60])), (), {}, 1.0
    )
    probes = prober(view)
    chosen = {probes._stalest_peer("rtt", lambda s: s.rtt_at) for _ in range(100)}
    assert view.links.estimate.sampled
    assert len(chosen) <= MAX_NEIGHBOURS < len(members) - 1
    # the plan's partners: the next stage, and the same stage of the other pipeline
    assert {members[40], members[50]} <= chosen
    # the random part rotates: a later set differs, bounded again
    first = set(view.links.estimate.neighbours)
    later = set(view.links.estimate.choose(ME, members, (), time.monotonic() + ROTATE_RANDOM_S))
    assert later != first and len(later) <= MAX_NEIGHBOURS


def test_telemetry_tells_only_the_neighbours_links_in_a_big_swarm() -> None:
    view = swarm_view(64)
    for peer in peers(64)[1:]:
        view.record_rtt(peer, 10.0, 1.0)
    prober(view).neighbours(1.0)
    row = view.links.own_row(1.0)
    assert set(row) == set(view.links.estimate.neighbours) and len(row) <= MAX_NEIGHBOURS
    small = swarm_view(8)
    for peer in peers(8)[1:]:
        small.record_rtt(peer, 10.0, 1.0)
    prober(small).neighbours(1.0)
    assert set(small.links.own_row(1.0)) == set(peers(8)[1:])


def test_telemetry_carries_the_coordinate_and_capacity_and_refuses_bad_ones() -> None:
    body = Telemetry({}, coordinate=coordinate(12.5), capacity=AccessCapacity(80.0, None))
    again = Telemetry.from_dict(body.to_dict())
    assert again.coordinate == body.coordinate and again.capacity == body.capacity
    assert Telemetry.from_dict({"links": {}}).coordinate is None  # an older peer's
    for bad in ({"v": [1, 2], "h": 1, "e": 0.1}, {"v": [1, 2, "x"], "h": 1, "e": 0.1}, 7):
        with pytest.raises(WireError):
            Telemetry.from_dict({"links": {}, "coord": bad})
    with pytest.raises(WireError):
        Telemetry.from_dict({"links": {}, "cap": {"up_mbps": -1}})


def test_a_round_trip_moves_our_coordinate_towards_the_peer_s_distance() -> None:
    view = swarm_view(4)
    view.links.estimate.note("Peer001", coordinate(0.0, error=0.05), None, 0.0)
    for t in range(30):
        view.record_rtt("Peer001", 50.0, float(t))
    predicted = view.links.estimate.coordinate.distance_ms(coordinate(0.0))
    assert predicted == pytest.approx(50.0, rel=0.2)
    assert view.links.estimate.coordinate.error < 1.0


def test_the_first_plan_of_a_big_swarm_waits_for_settled_coordinates_not_every_link() -> None:
    members = peers(40)
    roles = {p: "control-only" for p in members}
    run = RunSpec().replace(run_id="r")
    unsettled = {p: coordinate(float(i), error=1.0) for i, p in enumerate(members)}
    gaps = first_plan_gaps(members, roles, {}, {}, {}, run, coordinates=unsettled)
    assert gaps == ["0 of 40 coordinates settled"]
    settled = {p: coordinate(float(i), error=0.1) for i, p in enumerate(members)}
    assert first_plan_gaps(members, roles, {}, {}, {}, run, coordinates=settled) == []
    # trainers of a small swarm wait for every link, coordinates or not
    trainers = peers(4)
    t_roles = {p: "trainer" for p in trainers}
    addrs = {p: ["/ip4/127.0.0.1/tcp/1"] for p in trainers}
    untimed = run.replace(compute_aware=False)
    small = first_plan_gaps(trainers, t_roles, addrs, {}, {}, untimed, coordinates=settled)
    assert small == ["6 of 6 links"]


def test_a_swarm_whose_measured_links_are_all_near_plans_with_unsettled_coordinates() -> None:
    members = peers(40)
    roles = {p: "control-only" for p in members}
    run = RunSpec().replace(run_id="r")
    unsettled = {p: coordinate(0.0, error=1.0) for p in members}

    def ring(rtt_ms: float, hops: int) -> dict[tuple[str, str], Link]:
        pairs = [(members[i], members[(i + h) % 40]) for i in range(40) for h in range(1, hops + 1)]
        return {(min(a, b), max(a, b)): Link(rtt_ms, None, 1.0) for a, b in pairs}

    near = ring(0.8, 2)  # 80 round trips of a loopback swarm: 2 per member
    assert first_plan_gaps(members, roles, {}, near, {}, run, coordinates=unsettled) == []
    few = ring(0.8, 1)  # 1 per member: too little to call it a LAN
    assert first_plan_gaps(members, roles, {}, few, {}, run, coordinates=unsettled) != []
    far = {**near, **dict(list(ring(40.0, 2).items())[:27])}  # a third of them 40 ms
    assert first_plan_gaps(members, roles, {}, far, {}, run, coordinates=unsettled) != []
    jitter = {**near, **dict(list(ring(40.0, 2).items())[:12])}  # 15%: a loaded moment
    assert first_plan_gaps(members, roles, {}, jitter, {}, run, coordinates=unsettled) == []


def test_the_planner_matrix_marks_measured_links_and_estimates_the_rest() -> None:
    members = peers(24)
    coords = {p: coordinate(10.0 * i) for i, p in enumerate(members)}
    caps = {p: AccessCapacity(100.0, 100.0) for p in members}
    links = {(members[0], members[1]): Link(rtt_ms=7.0, bandwidth_mbps=40.0, age_s=1.0)}
    estimated = live_matrices(members, links, coords, caps)
    m = estimated.matrices
    assert estimated.rtt_measured[0, 1] and estimated.rate_measured[1, 0]
    assert int(estimated.rtt_measured.sum()) == 2  # one pair, both triangles
    assert m.delay_ms[0, 1] == pytest.approx(3.5)  # measured: RTT / 2
    assert m.bandwidth_gbps[0, 1] == pytest.approx(0.04)
    # estimated from the coordinates: |10 * 5 - 10 * 2| + 2 heights of 1 ms, halved
    assert m.delay_ms[2, 5] == pytest.approx(16.0)
    assert m.bandwidth_gbps[2, 5] == pytest.approx(0.1)  # the narrower access link
    # a small swarm keeps build_matrices' figures
    small = peers(6)
    small_links = {(small[0], small[1]): Link(rtt_ms=7.0, bandwidth_mbps=40.0, age_s=1.0)}
    kept = live_matrices(small, small_links, coords, caps)
    assert np.array_equal(kept.matrices.delay_ms, build_matrices(small, small_links).delay_ms)


def test_plan_links_are_the_pipeline_hops_and_the_data_parallel_rings() -> None:
    a, b, c, d, e, f = peers(6)
    plan = Plan(1, 1, a, 2, ((a, b), (c, d), (e, f)), (), {}, 1.0)
    assert set(plan_partners(plan, a)) == {b, c, e}
    expected = {(a, b), (c, d), (e, f), (a, c), (c, e), (a, e), (b, d), (d, f), (b, f)}
    assert plan_links(plan.pipelines) == expected
