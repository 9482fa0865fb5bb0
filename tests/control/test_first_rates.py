"""How soon a new swarm has a rate on every link (control/measuring.py): the first plan waits for
one (control/planning/readiness.py). A node that knows no member yet probes at the first pace
once it does; of the links it never tried, one the far end rated waits its turn; a member whose
address we lack is not probed (it would fail at once and count as the link's failure)."""

from __future__ import annotations

import time
from typing import Any, cast

import trio

from p2ptrain.control.measuring import (
    BANDWIDTH_PROBE_INTERVAL_S,
    FIRST_BANDWIDTH_PROBE_INTERVAL_S,
    LinkProber,
)
from p2ptrain.records import LinkReport, Telemetry
from tests.control.test_sampled_links import ME, swarm_view


def _prober(n: int) -> tuple[LinkProber, list[str]]:
    """A prober in a full-mesh swarm of `n` members (us included) and the others' ids."""
    view = swarm_view(n)
    return LinkProber(cast(Any, None), view, trio.Event()), sorted(set(view.members) - {ME})


def test_a_node_that_knows_no_member_yet_probes_at_the_first_pace() -> None:
    alone, _ = _prober(1)
    assert alone._bandwidth_interval_s() == FIRST_BANDWIDTH_PROBE_INTERVAL_S
    probes, others = _prober(3)
    assert probes._bandwidth_interval_s() == FIRST_BANDWIDTH_PROBE_INTERVAL_S  # none rated
    for peer in others:
        probes.view.links.record_bandwidth(peer, 100.0, time.monotonic())
    assert probes._bandwidth_interval_s() == BANDWIDTH_PROBE_INTERVAL_S  # steady once all are


def test_a_link_the_far_end_rated_waits_for_the_links_nobody_rated() -> None:
    probes, (rated, first, second) = _prober(4)
    report = LinkReport(rtt_ms=1.0, rtt_age_s=0.5, bandwidth_mbps=80.0, bandwidth_age_s=0.5)
    probes.view.links.note_telemetry(rated, Telemetry({ME: report}), time.monotonic())
    chosen = [probes._stalest_peer("bandwidth", lambda s: s.bandwidth_at) for _ in range(3)]
    assert set(chosen[:2]) == {first, second}
    assert chosen[2] == rated  # its turn comes before any link tried again
    # round trips have no such order: the far end's round trip is not ours to skip
    rtts = {probes._stalest_peer("rtt", lambda s: s.rtt_at) for _ in range(3)}
    assert rtts == {rated, first, second}


def test_a_link_that_keeps_failing_keeps_no_other_from_our_rate() -> None:
    probes, (rated, failing, other) = _prober(4)
    report = LinkReport(bandwidth_mbps=80.0, bandwidth_age_s=0.5)
    probes.view.links.note_telemetry(rated, Telemetry({ME: report}), time.monotonic())
    probes.view.links.record_bandwidth(other, 90.0, time.monotonic())
    assert probes._stalest_peer("bandwidth", lambda s: s.bandwidth_at) == failing
    # tried and still unrated: the far end's link, never tried by us, goes next
    assert probes._stalest_peer("bandwidth", lambda s: s.bandwidth_at) == rated


def test_members_we_cannot_dial_yet_are_not_probed() -> None:
    probes, (known, unknown, _) = _prober(4)
    dialable = {known}.__contains__
    picks = {probes._stalest_peer("rtt", lambda s: s.rtt_at, dialable) for _ in range(4)}
    assert picks == {known}
    assert probes._stalest_peer("rtt", lambda s: s.rtt_at, lambda peer: False) is None
    assert unknown not in probes._tried["rtt"]  # not counted as tried: first once dialable
