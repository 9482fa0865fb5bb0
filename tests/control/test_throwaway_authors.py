"""Floods signed by throwaway keys (a key per message costs nothing): the peer that forwards an
organiser-only message it should have refused is blamed, GossipSub's score table and our log do
not grow with the authors, and what we keep of members (NodeState.latest, the forgetting pace)
does not outlive them nor stretch with their number."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, cast

import pytest
from libp2p.peer.id import ID

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.gossip import CONTROL_TOPIC, validator_for
from p2ptrain.control.membership import (
    FORGET_DEAD_AFTER_S,
    UNCHANGED_RECORD_S,
    Member,
    Membership,
    record_pace,
    record_renew_s,
)
from p2ptrain.control.node import ControlNode, NodeConfig
from p2ptrain.records import PeerRecord, RunSpec
from p2ptrain.records.fields import MAX_PEERS
from tests.control.test_gossip_screen import ORGANISER, RUN_ID, Author, make_node, validate


def forwarded_run_spec(forwarder: str) -> tuple[ID, Any]:
    """A "run" message a fresh key signed (only the organiser's may), as `forwarder` sends it."""
    return ID.from_base58(forwarder), Author().message("run", {})


def test_the_forwarder_of_a_strangers_run_spec_is_blamed_and_blocked() -> None:
    state, intake = make_node(admission="open")
    validate_control = validator_for(CONTROL_TOPIC, state, intake)
    attacker = Author().id
    for _ in range(3):
        assert not validate_control(*forwarded_run_spec(attacker))
    # honest nodes never forward what they refuse: a few such messages block the forwarder
    assert state.view.penalties.is_blocked(attacker, time.monotonic())


def test_throwaway_authors_are_logged_one_in_a_hundred(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="p2ptrain")
    state, intake = make_node(admission="open")
    validate_control = validator_for(CONTROL_TOPIC, state, intake)
    authors = []
    for _ in range(300):
        forwarder, msg = forwarded_run_spec(Author().id)
        authors.append(ID(msg.from_id).to_base58())
        assert not validate_control(forwarder, msg)
    about_authors = [r for r in caplog.records if any(a in r.getMessage() for a in authors)]
    # the forwarder's line names the author too; the authors' own are 1 in 100 (1, 101, 201)
    blaming_authors = [r for r in about_authors if "forwarded" not in r.getMessage()]
    assert len(blaming_authors) == 3


def test_gossipsub_scores_only_the_peers_it_talks_to() -> None:
    """py-libp2p forgets a score only when its peer disconnects: a throwaway author (never
    connected) scored there would stay, walked every heartbeat, for good."""
    node = ControlNode(
        NodeConfig(
            seed=ORGANISER, role="bootstrap", run=RunSpec().replace(run_id=RUN_ID), print_addr=False
        )
    )
    scorer = node.gossipsub.scorer
    assert scorer is not None
    forwarder = ID.from_base58(Author().id)
    node.pubsub.peers[forwarder] = cast(Any, object())  # a pubsub peer: connected
    validate_control = validator_for(CONTROL_TOPIC, node.state, node.intake)
    for _ in range(2):
        assert not validate_control(*forwarded_run_spec(forwarder.to_base58()))
    assert set(scorer.behavior_penalty) == {forwarder}


def test_what_we_hold_of_a_member_goes_with_it_but_the_organisers_stays() -> None:
    state, intake = make_node(admission="open")
    organiser_id = identity.peer_id_of(ORGANISER)
    assert state.view.run is not None
    organiser_record = PeerRecord((), "bootstrap", False, "0", {})
    bodies: tuple[wire.Body, ...] = (state.view.run, organiser_record)
    for seq, body in enumerate(bodies, start=1):
        data = wire.encode(ORGANISER, seq, body, run_id=RUN_ID)
        assert intake.apply(wire.decode(data), data, organiser_id, "sync", time.monotonic())
    members = [Author() for _ in range(3)]
    for member in members:
        assert validate(state, intake, member, member.record())
        assert validate(state, intake, member, member.telemetry())
    organisers = {(organiser_id, "run"), (organiser_id, "peer")}
    assert set(state.latest) == organisers | {
        (m.id, k) for m in members for k in ("peer", "telemetry")
    }
    del state.view.members[members[0].id]  # revoked, say
    assert (members[0].id, "peer") not in state.latest
    state.view.forget_stale(time.monotonic() + 100 * FORGET_DEAD_AFTER_S)  # all long silent
    assert not state.view.members
    assert set(state.latest) == organisers
    assert state.latest.fingerprint(members[1].id, "peer") is None


def test_a_flood_of_identities_cannot_stretch_forgetting_the_dead() -> None:
    members = Membership()
    for _ in range(20 * MAX_PEERS):  # records of throwaway identities, all silent since 0
        members[os.urandom(8).hex()] = Member(PeerRecord((), "control-only", True, "0", {}), 0.0)
    # counted up to MAX_PEERS (no plan names more): forgotten after 5,120 s, not 102,400 s
    bound_s = FORGET_DEAD_AFTER_S * MAX_PEERS / UNCHANGED_RECORD_S
    assert len(members.forget_dead(bound_s + 1.0)) == 20 * MAX_PEERS
    # live members re-state their records inside that bound, however many the records
    assert record_renew_s(20 * MAX_PEERS) == record_renew_s(MAX_PEERS) < bound_s
    assert record_pace(1000) == 1000 / UNCHANGED_RECORD_S  # a real swarm's pace: as before
