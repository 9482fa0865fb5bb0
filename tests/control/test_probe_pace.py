"""Round-trip probes in steady state (control/measuring.py): one a second until the plan has
stood PLAN_STOOD_S, then only while some neighbour's round trip is RTT_REFRESH_S old."""

from __future__ import annotations

import time
from typing import Any, cast

import trio

from p2ptrain.control import measuring
from p2ptrain.control.measuring import PLAN_STOOD_S, RTT_REFRESH_S
from p2ptrain.records import Plan
from tests.control.test_view import ME, A, B, make_view


def test_probes_wait_for_stale_round_trips_once_the_plan_stood() -> None:
    t = time.monotonic()
    view, _ = make_view(peers=(A, B), now=t)
    view.hears_telemetry = False  # members live by their records: alive for minutes here
    prober = measuring.LinkProber(cast(Any, None), view, trio.Event())
    assert prober._rtt_probe_due(t)  # no plan yet
    view.plan = Plan(1, 1, ME, 1, ((A,), (B,), (ME,)), (), {}, 1.0)
    view.plan_version += 1
    for peer in (A, B):
        view.record_rtt(peer, 5.0, t)
    assert prober._rtt_probe_due(t + 1)  # the plan has not stood yet
    later = t + PLAN_STOOD_S + 2  # a second past every boundary: float sums round
    for peer in (A, B):
        view.record_rtt(peer, 5.0, later - 1)
    assert not prober._rtt_probe_due(later)  # every neighbour's round trip is fresh
    # a second past the boundary: (t + 30) + 30 - (t + 30) can round below 30 for some t
    stale = later + RTT_REFRESH_S
    assert prober._rtt_probe_due(stale)  # now they are stale
    view.record_rtt(A, 5.0, stale)
    assert prober._rtt_probe_due(stale)  # B's still is
    view.plan_version += 1  # a new plan: one a second again, whatever the ages
    view.record_rtt(B, 5.0, stale)
    assert prober._rtt_probe_due(stale + 1)


def test_a_sampled_set_refreshes_round_trips_less_often_within_their_lifetime() -> None:
    from p2ptrain.control.links import MAX_LINK_AGE_S
    from p2ptrain.control.measuring import SAMPLED_RTT_REFRESH_S

    assert RTT_REFRESH_S < SAMPLED_RTT_REFRESH_S < MAX_LINK_AGE_S
    t = time.monotonic()
    view, _ = make_view(peers=(A, B), now=t)
    view.hears_telemetry = False
    prober = measuring.LinkProber(cast(Any, None), view, trio.Event())
    view.plan = Plan(1, 1, ME, 1, ((A,), (B,), (ME,)), (), {}, 1.0)
    view.plan_version += 1
    prober._rtt_probe_due(t)  # the plan's version noted at t
    later = t + PLAN_STOOD_S + 1
    for peer in (A, B):
        view.record_rtt(peer, 5.0, later)
    view.links.estimate.sampled = True  # past FULL_MESH_PEERS members
    assert not prober._rtt_probe_due(later + RTT_REFRESH_S + 1)
    assert prober._rtt_probe_due(later + SAMPLED_RTT_REFRESH_S + 1)  # past the boundary
