"""The status document stays within what every reader accepts (MAX_STATUS_PEERS peers,
MAX_STATUS_LINKS links: control/observer.py refuses more): a flood of identities, or members
naming every other, made every node's status unreadable. The plan's peers and links stay in,
and the document says how much it left out."""

from __future__ import annotations

import pytest

from p2ptrain.control import status as status_mod
from p2ptrain.control.status import swarm_status
from p2ptrain.records import PeerRecord, SwarmStatus
from tests.control.test_view import ME, A, B, C, make_view, plan, record


def test_a_swarm_past_the_caps_keeps_the_plans_peers_and_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status_mod, "MAX_STATUS_PEERS", 3)
    monkeypatch.setattr(status_mod, "MAX_STATUS_LINKS", 1)
    v, feed = make_view()
    v.own_record = PeerRecord.from_dict(record())
    v.accept(feed("claim", A, {"term": 1}), 0.1)
    v.accept(feed("plan", A, plan(A, 1, 1, peers=(B,))), 0.2)
    v.record_rtt(A, 2.0, 0.3)  # ME-A: not the plan's
    v.record_rtt(C, 1.0, 0.4)  # ME-C: fresher, not the plan's either
    status = swarm_status(v, 0.5)
    # ourselves, the planner and the plan's peer; C, heard from longest ago, left out
    assert [p.id for p in status.peers] == [A, B, ME]
    assert status.peers_left_out == 1
    assert [(x.a, x.b) for x in status.links] == [(A, ME)] and status.links_left_out == 1
    assert C not in status.telemetry_age_s
    doc = status.to_dict()
    assert SwarmStatus.from_dict(doc).to_dict() == doc
    monkeypatch.setattr(status_mod, "MAX_STATUS_PEERS", 10)
    status = swarm_status(v, 0.6)  # every peer fits; one link of two does: the fresher
    assert status.peers_left_out == 0 and status.links_left_out == 1
    assert [(x.a, x.b) for x in status.links] == [(C, ME)]


def test_a_document_within_the_caps_says_nothing_left_out() -> None:
    v, _ = make_view()
    doc = swarm_status(v, 0.5).to_dict()
    assert "peers_left_out" not in doc and "links_left_out" not in doc
