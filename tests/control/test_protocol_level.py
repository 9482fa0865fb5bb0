"""Protocol levels (records/peer.py PROTOCOL_LEVEL): a planner plans only members of its own
level, or of none (peers of before the field); a member the live planner leaves out for its
level says so (`version`), and its record, its status line and the log name the level."""

from __future__ import annotations

import logging

import pytest

from p2ptrain.control import membership
from p2ptrain.control.candidacy import ELECTION_GRACE_S
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.control.status import swarm_status
from p2ptrain.control.waiting import waiting_for
from p2ptrain.records import PROTOCOL_LEVEL, PeerRecord, RunSpec
from tests.control.test_view import A, B, C, make_view, record


def test_members_of_another_level_are_never_planned(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    membership._other_levels.counts.clear()  # sampled: an earlier test's member was the 1st
    v, feed = make_view(peers=())
    assert v.accept(feed("peer", A, record("trainer")), 0.0) is None
    ours = {**record("trainer"), "protocol": PROTOCOL_LEVEL}
    newer = {**record("trainer"), "version": "9.0", "protocol": PROTOCOL_LEVEL + 1}
    assert v.accept(feed("peer", B, ours), 0.0) is None
    assert v.accept(feed("peer", C, newer), 0.0) is None
    assert plannable_members(v, 1.0) == [A, B]  # A: no level stated (an older peer)
    assert f"runs p2ptrain 9.0 at protocol level {PROTOCOL_LEVEL + 1}" in caplog.text
    peers = {p.id: p for p in swarm_status(v, 1.0).peers}
    assert (peers[A].protocol, peers[B].protocol, peers[C].protocol) == (
        None,
        PROTOCOL_LEVEL,
        PROTOCOL_LEVEL + 1,
    )


def test_a_member_the_planner_of_another_level_leaves_out_says_so() -> None:
    v, feed = make_view(peers=())
    v.run = RunSpec()
    newer = {**record("trainer"), "version": "9.0", "protocol": PROTOCOL_LEVEL + 1}
    assert v.accept(feed("peer", A, newer), 0.0) is None
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert v.planner == A
    wait = waiting_for(v, ELECTION_GRACE_S)
    assert wait.kind == "version"
    assert f"at level {PROTOCOL_LEVEL + 1}" in wait.text and "9.0" in wait.text
    same, feed = make_view(peers=())
    same.run = RunSpec()
    assert same.accept(feed("peer", A, record("trainer")), 0.0) is None  # no level: older
    assert same.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert waiting_for(same, ELECTION_GRACE_S).kind != "version"


def test_a_record_states_its_level_and_an_older_one_reads_as_none() -> None:
    base = {"addrs": [], "role": "trainer", "planner_capable": False, "version": "0.1.0"}
    stated = PeerRecord.from_dict({**base, "hardware": {}, "protocol": 7})
    assert stated.protocol == 7 and stated.to_dict()["protocol"] == 7
    older = PeerRecord.from_dict({**base, "hardware": {}})
    assert older.protocol is None and "protocol" not in older.to_dict()
