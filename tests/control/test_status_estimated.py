"""`status` and the dashboard tell measured links from estimated ones (issue 29): past
FULL_MESH_PEERS members the pairs nobody measured are listed as estimated (from the ends'
coordinates and capacities), marked in the JSON, in the text matrix and kept out of the
dashboard's measured-link metrics; a small swarm's status is as it was."""

from __future__ import annotations

import time

from p2ptrain.cli.status_cmd import format_status
from p2ptrain.control.membership import Member
from p2ptrain.control.status import swarm_status
from p2ptrain.control.view import SwarmView
from p2ptrain.records import PeerRecord, SwarmStatus
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate
from p2ptrain.web.metrics import metrics_text

ME = "Peer000"


def view_of(n: int) -> tuple[SwarmView, list[str], float]:
    """Our view of `n` members (us included) that gossiped their coordinates and capacities,
    and one link we measured."""
    now = time.monotonic()
    view = SwarmView(self_id=ME, role="control-only", planner_capable=True, started_at=now)
    view.own_record = PeerRecord((), "control-only", True, "0", {})
    ids = [f"Peer{i:03d}" for i in range(n)]
    for i, peer in enumerate(ids[1:], start=1):
        view.members[peer] = Member(PeerRecord((), "control-only", True, "0", {}), now)
        coordinate = NetCoordinate((10.0 * i, 0.0, 0.0), 1.0, 0.1)
        view.links.estimate.note(peer, coordinate, AccessCapacity(50.0, 80.0), now)
    view.record_rtt(ids[1], 3.0, now)
    return view, ids, now


def test_a_big_swarm_s_status_lists_the_unmeasured_links_as_estimated() -> None:
    view, ids, now = view_of(20)
    status = SwarmStatus.from_dict(swarm_status(view, now).to_dict())  # as `status --json`
    measured = [link for link in status.links if not link.estimated]
    estimated = [link for link in status.links if link.estimated]
    assert [(link.a, link.b) for link in measured] == [(ME, ids[1])]
    assert len(measured) + len(estimated) == 20 * 19 // 2
    far = next(link for link in estimated if (link.a, link.b) == (ids[2], ids[5]))
    assert far.rtt_ms == 32.0  # |50 - 20| + two 1 ms heights
    assert far.bandwidth_mbps == 50.0  # the narrower uplink
    # the JSON of a measured link is as before; an estimated one says so
    assert "estimated" not in measured[0].to_dict() and far.to_dict()["estimated"] is True
    text = format_status(status)
    assert "~32.00" in text and "~ estimated from coordinates and capacities" in text
    assert " 3.00" in text  # our measured link, unmarked
    exposition = metrics_text(status, None).decode()
    assert exposition.count("p2ptrain_link_rtt_seconds{") == 1  # the measured link only


def test_a_small_swarm_s_status_lists_measured_links_only() -> None:
    view, ids, now = view_of(8)
    status = swarm_status(view, now)
    assert [(link.a, link.b, link.estimated) for link in status.links] == [(ME, ids[1], False)]
    assert "~" not in format_status(status)
