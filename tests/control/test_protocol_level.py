"""Protocol levels (records/peer.py PROTOCOL_LEVEL): a planner plans only members of its own
level, or of none (peers of before the field); a member the live planner leaves out for its
level says so (`version`), and its record, its status line and the log name the level."""

from __future__ import annotations

import logging

import pytest

from p2ptrain.control import membership
from p2ptrain.control.candidacy import ELECTION_GRACE_S, should_claim
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


def _leveled_view(me: str, levels: dict[str, int | None], organiser: int | None):
    """A view (ours at PROTOCOL_LEVEL) of candidates at `levels` and an organiser whose record
    states `organiser` (None: a bootstrap of before levels)."""
    v, feed = make_view(me=me, peers=())
    boot = {**record("bootstrap"), "planner_capable": False}
    if organiser is not None:
        boot["protocol"] = organiser
    assert v.bootstrap_id is not None
    assert v.accept(feed("peer", v.bootstrap_id, boot), 0.0) is None
    for peer, level in levels.items():
        body = record() if level is None else {**record(), "protocol": level}
        assert v.accept(feed("peer", peer, body), 0.0) is None
    return v, feed


def test_candidates_of_the_runs_level_claim_before_smaller_ids_of_another() -> None:
    """The run's level is its organiser's: an upgraded candidate claims first, though an older
    one has the smaller id (it would plan only the older members)."""
    now = ELECTION_GRACE_S + 0.1
    old = PROTOCOL_LEVEL - 1
    upgraded, _ = _leveled_view(C, {A: old, B: old}, organiser=PROTOCOL_LEVEL)
    assert should_claim(upgraded, now)  # A and B, smaller, are of the old level
    behind, _ = _leveled_view(A, {B: old, C: old}, organiser=old)
    assert not should_claim(behind, now)  # the run is of the old level: we, A, are off it
    # an organiser of before levels (or of none yet) ranks by id alone, as before
    unknown, _ = _leveled_view(C, {A: old, B: old}, organiser=None)
    assert not should_claim(unknown, now)


def test_a_live_planner_of_another_level_is_replaced_by_the_runs_level() -> None:
    now = ELECTION_GRACE_S + 0.1
    old = PROTOCOL_LEVEL - 1
    v, feed = _leveled_view(B, {A: old, C: PROTOCOL_LEVEL}, organiser=PROTOCOL_LEVEL)
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert v.planner == A and v.is_alive(A, now)
    assert should_claim(v, now)  # B, the smallest of the run's level, takes the role at once
    assert v.claim() == 2 and v.planner == B
    # C, of the run's level too, follows B and does not claim: a planner of its level stands
    w, feed = _leveled_view(C, {A: old, B: PROTOCOL_LEVEL}, organiser=PROTOCOL_LEVEL)
    assert w.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert not should_claim(w, now)  # B's turn first (its rank): C waits dead_after_s
    assert w.accept(feed("claim", B, {"term": 2}), now) is None
    assert w.planner == B and not should_claim(w, now)
    # a candidate of the old level never takes the role from a planner of the run's level
    x, feed = _leveled_view(A, {B: PROTOCOL_LEVEL}, organiser=PROTOCOL_LEVEL + 1)
    assert x.accept(feed("claim", B, {"term": 1}), 1.0) is None
    assert not should_claim(x, now)  # we are off the run's level (ours is PROTOCOL_LEVEL)
