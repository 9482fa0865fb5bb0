"""The organiser's current term in its own peer record (control/authored.py organiser_term):
a node that waits on the term learns it from the gossiped record, fresh, of the organiser only
(control/intake.py), without winning an RPC of a busy bootstrap."""

from __future__ import annotations

import time
from typing import Any, cast

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.authored import own_record
from p2ptrain.control.intake import ORGANISER_TERM_AGE_S
from p2ptrain.control.state import NodeState
from p2ptrain.control.term_learning import anchor_term
from p2ptrain.control.view import SwarmView
from p2ptrain.records import PeerRecord, RunSpec
from tests.control.test_gossip_screen import ORGANISER, RUN_ID, Author, make_node, record_body

BOOT = identity.peer_id_of(ORGANISER)


def record_of(author: str, term: int | None, age_s: float, seq: int) -> wire.Envelope:
    body = PeerRecord.from_dict({**record_body(role="bootstrap"), "term": term})
    return wire.Envelope("peer", author, seq, time.time() - age_s, body, RUN_ID)


def test_a_fresh_organiser_record_anchors_the_term_a_stale_or_strangers_does_not() -> None:
    state, intake = make_node(admission="open")  # the stranger's record is admitted
    view = state.view
    now = time.monotonic()
    assert not view.term_anchored
    assert intake.apply(record_of(BOOT, None, 0.0, 1), b"{}", BOOT, "gossip", now)
    assert not view.term_anchored  # the organiser does not know the term yet
    stale = record_of(BOOT, 7, ORGANISER_TERM_AGE_S + 5.0, 2)
    assert intake.apply(stale, b"{}", "Relay", "sync", now)
    assert not view.term_anchored  # the swarm may have moved past term 7 since
    stranger = Author()
    assert intake.apply(record_of(stranger.id, 9, 0.0, 1), b"{}", stranger.id, "gossip", now)
    assert not view.term_anchored  # a member's word is no anchor
    assert intake.apply(record_of(BOOT, 4, 1.0, 3), b"{}", "Relay", "gossip", now)
    assert view.term_anchored and view.known_term() == 4


def test_the_bootstrap_puts_its_term_in_its_record_once_it_knows_it() -> None:
    view = SwarmView(
        self_id=BOOT,
        role="bootstrap",
        planner_capable=False,
        started_at=0.0,
        bootstrap_id=BOOT,
        run=RunSpec().replace(run_id=RUN_ID),
    )
    state = NodeState(
        seed=ORGANISER, role="bootstrap", peer_id=BOOT, host=cast(Any, None), view=view, hardware={}
    )
    assert own_record(state).term is None
    anchor_term(view, 3)
    assert own_record(state).term == 3
    assert PeerRecord.from_dict(own_record(state).to_dict()).term == 3
    member, _ = make_node()
    assert own_record(member).term is None  # only the organiser's record carries one
