"""Issue 29: telemetry's audience. Every node's telemetry goes to the planner candidates
(planner-token holders) and the bootstrap only: a node outside that audience does not subscribe
to the telemetry topic, ignores a member's telemetry that reaches it anyway (gossip or sync),
hears members and candidates alive by their records (RECORD_DEAD_AFTER_S), and hears the planner
by its claims (PLANNER_DEAD_AFTER_S), which it re-sends every few seconds to everyone."""

from __future__ import annotations

import json
import random
import time
from typing import Any, cast

import pytest
import trio

from p2ptrain.control import wire
from p2ptrain.control.gossip import CONTROL_TOPIC
from p2ptrain.control.measuring import far_coordinate
from p2ptrain.control.membership import (
    DEAD_AFTER_S,
    PLANNER_DEAD_AFTER_S,
    RECORD_DEAD_AFTER_S,
    STEADY_DEAD_AFTER_S,
)
from p2ptrain.control.publishing import (
    MAX_PLAN_REBROADCAST_S,
    STEADY_AFTER_S,
    STEADY_CLAIM_INTERVAL_S,
    STEADY_SILENCE_EARLIER_S,
    STEADY_TELEMETRY_INTERVAL_S,
    TELEMETRY_INTERVAL_S,
    Publisher,
    plan_resend_s,
    telemetry_pace,
)
from p2ptrain.control.sync import (
    PULLED_PLAN_MAX_AGE_S,
    PULLED_RECORD_MAX_AGE_S,
    PullSync,
    decode_pulled,
    read_request,
)
from p2ptrain.records import issue_token
from p2ptrain.records.estimate import NetCoordinate
from p2ptrain.records.replies import SyncPage, SyncRequest
from tests.control.test_gossip_screen import (
    ORGANISER,
    RUN_ID,
    Author,
    make_node,
    record_body,
    validate,
)
from tests.records.samples import plan_dict


class Candidate(Author):
    """An author holding the organiser's planner token."""

    def __init__(self) -> None:
        super().__init__()
        self.token = issue_token(ORGANISER, self.id, True, time.time() + 3600, RUN_ID)


def audience_and_outsider() -> tuple[Any, Any]:
    inside, outside = make_node(), make_node()
    outside[0].view.hears_telemetry = False
    return inside, outside


def test_outside_the_audience_a_members_telemetry_is_ignored_a_candidates_applied() -> None:
    (inside, inside_intake), (outside, outside_intake) = audience_and_outsider()
    member, candidate = Author(), Candidate()
    for state, intake in ((inside, inside_intake), (outside, outside_intake)):
        assert validate(state, intake, member, member.record())
        assert validate(state, intake, candidate, candidate.record())
    assert validate(inside, inside_intake, member, member.telemetry())
    assert inside.view.members[member.id].metrics is None  # applied: {"links": {}} has none
    assert not validate(outside, outside_intake, member, member.telemetry())
    assert outside.view.penalties.score(member.id) == 0  # ignored, not blamed
    # a candidate's telemetry, on the control topic, reaches and is applied by everyone
    on_control = candidate.message("telemetry", {"links": {}}, CONTROL_TOPIC)
    assert validate(outside, outside_intake, candidate, on_control)
    # a member's telemetry on the control topic is not forwarded, nor blamed
    assert not validate(inside, inside_intake, member, member.message("telemetry", {"links": {}}))
    assert inside.view.penalties.score(member.id) == 0


def test_outside_the_audience_peers_live_by_their_records_the_planner_by_claims() -> None:
    (_, _), (outside, intake) = audience_and_outsider()
    member, candidate, planner = Author(), Candidate(), Candidate()
    for author in (member, candidate, planner):
        assert validate(outside, intake, author, author.record())
    outside.view._set_planner(planner.id, 1)
    view, heard = outside.view, time.monotonic()
    later = heard + PLANNER_DEAD_AFTER_S + 5.0
    assert view.is_alive(member.id, later)  # a record a minute is its proof of life here
    # a candidate's telemetry stays in the audience: its record (and its claim) speak for it
    assert view.is_alive(candidate.id, later)
    # the planner's claims come every STEADY_CLAIM_INTERVAL_S: two may be lost, not three
    assert 3 * STEADY_CLAIM_INTERVAL_S < PLANNER_DEAD_AFTER_S
    assert view.is_alive(planner.id, heard + 2 * STEADY_CLAIM_INTERVAL_S + 1.0)
    assert not view.is_alive(planner.id, later)
    assert not view.is_alive(member.id, heard + RECORD_DEAD_AFTER_S + 5.0)
    assert not view.is_alive(candidate.id, heard + RECORD_DEAD_AFTER_S + 5.0)
    view.hears_telemetry = True  # in the audience, every member lives by its telemetry
    assert not view.is_alive(member.id, heard + DEAD_AFTER_S + 5.0)
    assert not view.is_alive(planner.id, heard + DEAD_AFTER_S + 5.0)


def test_a_claim_keeps_the_planner_alive_outside_the_audience() -> None:
    (_, _), (outside, intake) = audience_and_outsider()
    planner = Candidate()
    assert validate(outside, intake, planner, planner.record())
    start = time.monotonic()
    assert validate(outside, intake, planner, planner.message("claim", {"term": 1}))
    view = outside.view
    assert view.planner == planner.id
    assert view.is_alive(planner.id, start + PLANNER_DEAD_AFTER_S - 1.0)
    assert not view.is_alive(planner.id, start + PLANNER_DEAD_AFTER_S + 5.0)


def test_sync_serves_an_outsider_no_telemetry() -> None:
    state, intake = make_node(joined=True)
    member, candidate = Author(), Candidate()
    for author in (member, candidate):
        assert validate(state, intake, author, author.record())
    assert validate(state, intake, member, member.telemetry())
    on_control = candidate.message("telemetry", {"links": {}}, CONTROL_TOPIC)
    assert validate(state, intake, candidate, on_control)
    sync = PullSync(state, intake)

    def served(request: SyncRequest) -> set[tuple[str, str]]:
        body = json.dumps(request.to_dict()).encode()
        page = SyncPage.from_dict(trio.run(sync.respond_sync, body))
        envelopes = [wire.decode(str(e).encode()) for e in page.envelopes]
        return {(e.author, e.kind) for e in envelopes}

    everything = served(SyncRequest(0))
    assert {(member.id, "telemetry"), (candidate.id, "telemetry")} <= everything
    outsider = served(SyncRequest(0, telemetry=False))
    own = (state.peer_id, "telemetry")  # the server's own, fresh on page 0
    assert own in everything
    assert everything - outsider == {(member.id, "telemetry"), (candidate.id, "telemetry"), own}
    assert served(SyncRequest(0, term_only=True)) == set()  # the term only (control/sync.py)


def test_a_sync_request_is_read_or_refused_as_one_error() -> None:
    assert read_request(b"") == SyncRequest(0)
    assert read_request(b'{"cursor": 3}') == SyncRequest(3)  # what older nodes send
    assert read_request(b'{"cursor": 0, "telemetry": false}') == SyncRequest(0, telemetry=False)
    assert json.loads(json.dumps(SyncRequest(2).to_dict())) == {"cursor": 2}
    asked = read_request(b'{"cursor": 0, "term_only": true}')
    assert asked == SyncRequest(0, term_only=True)
    bad_flag = b'{"cursor": 1, "term_only": "yes"}'
    for bad in (
        b"[",
        b'{"cursor": -1}',
        b'{"cursor": 1, "telemetry": 1}',
        b"[" * 5000,
        b"{}",
        bad_flag,
    ):
        try:
            read_request(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad[:20]!r} was read")


def test_a_probes_trailer_is_a_coordinate_or_nothing() -> None:
    """Fuzz: whatever a probed peer sends after its echoes, the prober gets a valid coordinate
    or None (control/measuring.py's far_coordinate), never an exception."""
    rng = random.Random(29)
    valid = json.dumps(NetCoordinate((1.0, -2.0, 3.5), 7.25, 0.4).to_dict()).encode()
    assert far_coordinate(valid) == NetCoordinate((1.0, -2.0, 3.5), 7.25, 0.4)
    for _ in range(3000):
        if rng.random() < 0.5:
            data = rng.randbytes(rng.randrange(0, 80))
        else:
            mutated = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            data = bytes(mutated)
        got = far_coordinate(data)
        assert got is None or isinstance(got, NetCoordinate)


def test_a_pulled_record_may_be_minutes_old_anything_else_not() -> None:
    """Members re-sign an unchanged record once a minute: sync must still hand a newcomer the
    record of a quiet member (its age proves it alive only as of its `ts`)."""
    member = Author()
    five_minutes_ago = time.time() - 300.0
    body = record_body(member.token.encode())
    record = wire.sign(member.seed, "peer", 1, body, ts=five_minutes_ago)
    telemetry = wire.sign(member.seed, "telemetry", 2, {"links": {}}, ts=five_minutes_ago)
    with pytest.raises(wire.WireError, match="stale"):
        wire.decode(record)
    with pytest.raises(wire.WireError, match="stale"):
        decode_pulled(telemetry)
    assert decode_pulled(record).kind == "peer"
    too_old = wire.sign(member.seed, "peer", 3, body, ts=time.time() - PULLED_RECORD_MAX_AGE_S - 60)
    with pytest.raises(wire.WireError, match="stale"):
        decode_pulled(too_old)
    # a large swarm re-states records less often (membership.record_pace): they may be older
    assert decode_pulled(too_old, pace=2.0).kind == "peer"


def test_a_pulled_plan_may_be_minutes_old() -> None:
    """A large plan is re-sent every few minutes at most (publishing.plan_resend_s): sync
    hands a newcomer the planner's plan as a peer last heard it."""
    planner = Author()
    plan = {**plan_dict(), "planner": planner.id}
    minutes_ago = wire.sign(planner.seed, "plan", 1, plan, ts=time.time() - 900.0)
    assert decode_pulled(minutes_ago).kind == "plan"
    too_old = wire.sign(planner.seed, "plan", 2, plan, ts=time.time() - PULLED_PLAN_MAX_AGE_S - 60)
    with pytest.raises(wire.WireError, match="stale"):
        decode_pulled(too_old, pace=5.0)
    assert plan_resend_s(4.0, 800) == 4.0  # a small swarm's plan: as before
    assert 300.0 < plan_resend_s(30.0, 70_000) <= MAX_PLAN_REBROADCAST_S  # 1,000 peers'


def test_a_large_swarm_slows_its_telemetry_once_the_plan_stood() -> None:
    """Past the full mesh (a sampled neighbour set) members publish every
    STEADY_TELEMETRY_INTERVAL_S once the plan stood STEADY_AFTER_S, and the audience allows the
    slower pace's silence from a little earlier; a small swarm keeps the fast pace throughout."""
    fast = (TELEMETRY_INTERVAL_S, DEAD_AFTER_S)
    assert telemetry_pace(False, 1e6) == fast
    assert telemetry_pace(True, None) == fast  # no plan yet
    assert telemetry_pace(True, 0.0) == fast
    early = STEADY_AFTER_S - STEADY_SILENCE_EARLIER_S
    assert telemetry_pace(True, early) == (TELEMETRY_INTERVAL_S, STEADY_DEAD_AFTER_S)
    assert telemetry_pace(True, STEADY_AFTER_S) == (
        STEADY_TELEMETRY_INTERVAL_S,
        STEADY_DEAD_AFTER_S,
    )
    # as many messages may be lost at the slow pace as at the fast one
    assert STEADY_DEAD_AFTER_S / STEADY_TELEMETRY_INTERVAL_S == DEAD_AFTER_S / TELEMETRY_INTERVAL_S


def test_in_the_audience_the_planner_is_heard_at_the_fast_pace() -> None:
    (inside, intake), _ = audience_and_outsider()
    member, planner = Author(), Candidate()
    for author in (member, planner):
        assert validate(inside, intake, author, author.record())
    view, heard = inside.view, time.monotonic()
    view._set_planner(planner.id, 1)
    view.members.telemetry_silence_s = STEADY_DEAD_AFTER_S  # a large swarm's steady state
    between = heard + DEAD_AFTER_S + 2.0
    assert view.is_alive(member.id, between)
    assert not view.is_alive(planner.id, between)  # its silence starts a failover as before
    assert not view.is_alive(member.id, heard + STEADY_DEAD_AFTER_S + 2.0)


def test_the_audience_keeps_the_long_silence_a_while_after_a_new_plan() -> None:
    """Members at the slow pace hear a new plan late: the audience shortens its allowance only
    STEADY_DEAD_AFTER_S after it last was due, and lengthens it at once."""
    state, _ = make_node()
    publisher = Publisher(state, cast(Any, None))
    members = state.view.members
    publisher._allow_silence(STEADY_DEAD_AFTER_S, 100.0)
    assert members.telemetry_silence_s == STEADY_DEAD_AFTER_S
    publisher._allow_silence(DEAD_AFTER_S, 101.0)  # a new plan: kept a while
    assert members.telemetry_silence_s == STEADY_DEAD_AFTER_S
    publisher._allow_silence(DEAD_AFTER_S, 100.0 + STEADY_DEAD_AFTER_S)
    assert members.telemetry_silence_s == DEAD_AFTER_S
