"""Whom a node syncs from (control/sync.py sync_source): until it knows the current term, whoever
can tell it; then a random connected live member."""

from __future__ import annotations

from p2ptrain import identity
from p2ptrain.control.sync import (
    SYNC_INTERVAL_S,
    UNANCHORED_SYNC_INTERVAL_S,
    sync_interval_s,
    sync_source,
)
from p2ptrain.control.view import SwarmView
from p2ptrain.records import issue_token
from tests.control.test_view import ORGANISER, Feed, make_view, record

BOOT = identity.peer_id_of(ORGANISER)


def members_token(peer: str) -> str:
    return issue_token(ORGANISER, peer, False, 2e9).encode()


def test_an_unanchored_member_asks_the_organiser_then_anyone() -> None:
    v, _ = make_view(anchor=None)
    assert sync_source(v, []) is None
    assert all(sync_source(v, ["Aaaa", BOOT, "Bbbb"]) == BOOT for _ in range(20))
    assert sync_source(v, ["Aaaa"]) == "Aaaa"  # not connected to it yet: anyone meanwhile
    v.learn_term(BOOT, 3)
    assert {sync_source(v, ["Aaaa", BOOT, "Bbbb"]) for _ in range(200)} == {"Aaaa", BOOT, "Bbbb"}


def test_a_fresh_organiser_asks_a_planner_token_holder_first() -> None:
    boot = SwarmView(
        self_id=BOOT, role="bootstrap", planner_capable=False, started_at=0.0, bootstrap_id=BOOT
    )
    feed = Feed()
    members = [f"M{i:03d}" for i in range(30)]
    for peer in members:
        assert (
            boot.accept(feed("peer", peer, {**record(), "token": members_token(peer)}), 0.0) is None
        )
    assert boot.accept(feed("peer", "Hold", record()), 0.0) is None  # Feed gives it a planner token
    assert not boot.may_plan("M000") and boot.may_plan("Hold")
    assert all(sync_source(boot, [*members, "Hold"]) == "Hold" for _ in range(20))
    assert sync_source(boot, members) in members  # no holder connected: members meanwhile
    boot.learn_term("Hold", None)  # a fresh swarm's holder knows no term: ours is current
    assert boot.term_anchored
    assert len({sync_source(boot, [*members, "Hold"]) for _ in range(200)}) > 10


def test_only_who_waits_on_the_term_syncs_fast_before_it_knows_it() -> None:
    holder, _ = make_view(anchor=None)  # make_view's views hold planner tokens
    assert sync_interval_s(holder) == UNANCHORED_SYNC_INTERVAL_S
    holder.learn_term(BOOT, 0)
    assert sync_interval_s(holder) == SYNC_INTERVAL_S
    member = SwarmView(
        self_id="Memb",
        role="control-only",
        planner_capable=True,
        started_at=0.0,
        bootstrap_id=BOOT,
        own_token=issue_token(ORGANISER, "Memb", False, 2e9),
    )
    assert not member.term_anchored and sync_interval_s(member) == SYNC_INTERVAL_S
    boot = SwarmView(
        self_id=BOOT, role="bootstrap", planner_capable=False, started_at=0.0, bootstrap_id=BOOT
    )
    assert sync_interval_s(boot) == UNANCHORED_SYNC_INTERVAL_S
