"""Gossip dropped without blame (stale, or from an author the run does not admit) still costs a
parse and a signature check, and a fresh key per message escapes every author's rate: the peer
that delivers such drops has a budget of them (control/intake.py: QUIET_DROPS), past which it is
charged "flooding" and blocked. Honest forwarders, whose few stale messages or whose relays
before our first sync can be placed, stay far below it."""

from __future__ import annotations

import logging
import os
import time

import pytest
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from p2ptrain.control import wire
from p2ptrain.control.gossip import CONTROL_TOPIC, TELEMETRY_TOPIC, validator_for
from p2ptrain.control.intake import (
    QUIET_DROPS,
    QUIET_WINDOW_S,
    SETTLE_AFTER_SYNC_S,
    SETTLE_UNSYNCED_S,
    Intake,
)
from p2ptrain.control.penalties import BLOCK_S, PENALTY_BLOCK_SCORE
from p2ptrain.control.state import NodeState
from tests.control.test_gossip_screen import RUN_ID, Author, make_node, record_body

# each charge past the budget costs 1 ("flooding"): this many more block the forwarder (one
# more than ten for the decay meanwhile)
_TO_BLOCK = int(PENALTY_BLOCK_SCORE) + 1


def stale_message(age_s: float = 2 * wire.MAX_CLOCK_SKEW_S) -> rpc_pb2.Message:
    """A record a fresh throwaway key signed `age_s` ago: dropped as stale, blaming no author."""
    author = Author()
    data = wire.sign(author.seed, "peer", 1, record_body(), ts=time.time() - age_s, run_id=RUN_ID)
    return rpc_pb2.Message(
        from_id=ID.from_base58(author.id).to_bytes(),
        data=data,
        seqno=os.urandom(8),
        topicIDs=[CONTROL_TOPIC],
    )


def settled_node(admission: str = "token") -> tuple[NodeState, Intake]:
    """A node whose view had its time to gather the members' records."""
    state, intake = make_node(admission=admission)
    state.view.started_at -= SETTLE_UNSYNCED_S
    return state, intake


def test_a_forwarder_of_stale_messages_is_charged_past_its_budget_and_blocked() -> None:
    state, intake = make_node()  # stale needs no settling: no view of ours is involved
    validate = validator_for(CONTROL_TOPIC, state, intake)
    forwarder = Author().id
    for _ in range(QUIET_DROPS):
        assert not validate(ID.from_base58(forwarder), stale_message())
    assert state.view.penalties.score(forwarder) == 0  # within its budget: blame-free
    for _ in range(_TO_BLOCK):
        assert not validate(ID.from_base58(forwarder), stale_message())
    assert state.view.penalties.is_blocked(forwarder, time.monotonic())


def test_a_forwarder_of_throwaway_authors_quietly_refused_is_blocked() -> None:
    state, intake = settled_node()
    validate = validator_for(CONTROL_TOPIC, state, intake)
    forwarder = ID.from_base58(Author().id)
    for _ in range(QUIET_DROPS + _TO_BLOCK):
        stranger = Author()  # a token run: a record without a token is refused quietly
        assert not validate(forwarder, stranger.message("peer", record_body()))
        assert state.view.penalties.score(stranger.id) == 0
    assert state.view.penalties.is_blocked(forwarder.to_base58(), time.monotonic())


def test_one_refused_message_replayed_by_its_author_gets_it_blocked() -> None:
    state, intake = settled_node()
    validate = validator_for(CONTROL_TOPIC, state, intake)
    stranger = Author()
    msg = stranger.message("peer", record_body())  # the same bytes each time
    for _ in range(QUIET_DROPS + _TO_BLOCK):
        assert not validate(ID.from_base58(stranger.id), msg)
    assert state.view.penalties.is_blocked(stranger.id, time.monotonic())


def test_an_honest_forwarder_with_a_few_stale_messages_is_not_blamed() -> None:
    state, intake = settled_node()
    validate = validator_for(CONTROL_TOPIC, state, intake)
    forwarder = ID.from_base58(Author().id)
    # a backlog after a stall or a reconnect: a handful over 30 s old, the rest taken
    for _ in range(QUIET_DROPS // 4):
        assert not validate(forwarder, stale_message(age_s=wire.MAX_CLOCK_SKEW_S + 5))
        member = Author()
        assert validate(forwarder, member.record())
    assert state.view.penalties.score(forwarder.to_base58()) == 0


def test_relays_before_our_first_sync_are_not_counted() -> None:
    """A newcomer (no sync yet) is relayed every member's telemetry and claims before their
    records reach it: its honest forwarders are not blamed for what it cannot place yet."""
    state, intake = make_node()
    validate = validator_for(TELEMETRY_TOPIC, state, intake)
    forwarder = ID.from_base58(Author().id)
    members = [Author() for _ in range(4 * QUIET_DROPS)]
    for member in members:
        assert not validate(forwarder, member.telemetry())  # no record yet: ignored
    assert state.view.penalties.score(forwarder.to_base58()) == 0


def test_the_budget_slides_and_settling_follows_the_first_sync() -> None:
    """A fake clock: drops stamped `now`; the first synced envelope starts the settling."""
    state, intake = make_node()
    forwarder, author, t0 = Author().id, Author().id, 1000.0
    state.view.started_at = t0
    for _ in range(2 * QUIET_DROPS):  # an author we do not know, before any sync: not counted
        intake.drop_quietly(forwarder, "telemetry", TELEMETRY_TOPIC, t0, author)
    assert len(intake.quiet_drops) == 0
    data = Author().record().data
    assert intake.apply(wire.decode(data), data, forwarder, "sync", t0)  # our first sync
    assert state.view.penalties.score(forwarder) == 0
    settled = t0 + SETTLE_AFTER_SYNC_S
    for _ in range(QUIET_DROPS):
        intake.drop_quietly(forwarder, "telemetry", TELEMETRY_TOPIC, settled, author)
    assert state.view.penalties.score(forwarder) == 0
    # a window later the budget is whole again
    later = settled + QUIET_WINDOW_S + 1.0
    for _ in range(QUIET_DROPS):
        intake.drop_quietly(forwarder, "a late message", CONTROL_TOPIC, later)
    assert state.view.penalties.score(forwarder) == 0
    intake.drop_quietly(forwarder, "a late message", CONTROL_TOPIC, later)
    assert state.view.penalties.score(forwarder) == 1.0


def test_blocking_is_logged_once_per_block_and_forgotten_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="p2ptrain")
    _state, intake = make_node()
    peers = [Author().id for _ in range(3)]
    t0 = 1000.0
    for peer in peers:
        for _ in range(3):  # forged: 10 each, blocked at once
            intake.reject(peer, "forged", "test", "sync", t0)
    blocking = [r for r in caplog.records if r.getMessage().startswith("blocking")]
    assert len(blocking) == len(peers)
    # once the blocks ran out a sweep forgets them; a peer blocked again is logged again
    after = t0 + 2 * BLOCK_S
    intake.reject(peers[0], "forged", "test", "sync", after)
    blocking = [r for r in caplog.records if r.getMessage().startswith("blocking")]
    assert len(blocking) == len(peers) + 1
    assert set(intake._blocked_logged) == {peers[0]}


def test_a_node_that_is_itself_behind_charges_no_forwarder_for_its_stale_backlog() -> None:
    """Our loop stood still (or we hear everyone late): the whole backlog reads stale, and
    blaming each mesh peer that delivered it cut the node off from all of them."""
    state, intake = make_node()
    now = time.monotonic()
    stall = state.view.members.loop_stall
    stall.beat(now - 60.0)
    stall.beat(now)  # a minute between two beats: our loop stood still
    validate = validator_for(CONTROL_TOPIC, state, intake)
    forwarder = Author().id
    for _ in range(QUIET_DROPS + _TO_BLOCK):
        assert not validate(ID.from_base58(forwarder), stale_message())
    assert state.view.penalties.score(forwarder) == 0
