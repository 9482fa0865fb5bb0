"""Whom a node syncs from (control/sync_partners.py sync_sources): until it knows the current
term, whoever can tell it; then a random connected live member."""

from __future__ import annotations

from p2ptrain import identity
from p2ptrain.control.sync_partners import (
    SYNC_INTERVAL_S,
    UNANCHORED_SYNC_INTERVAL_S,
    sync_interval_s,
    sync_sources,
    term_only_from,
)
from p2ptrain.control.term_learning import learn_term
from p2ptrain.control.term_votes import MAX_TERM_ASKS
from p2ptrain.control.view import SwarmView
from p2ptrain.records import issue_token
from tests.control.test_view import ORGANISER, Feed, make_view, record

BOOT = identity.peer_id_of(ORGANISER)


def members_token(peer: str) -> str:
    return issue_token(ORGANISER, peer, False, 2e9).encode()


def test_an_unanchored_member_asks_the_organiser_then_anyone() -> None:
    v, _ = make_view(anchor=None)
    assert sync_sources(v, []) == []
    assert all(sync_sources(v, ["Aaaa", BOOT, "Bbbb"]) == [BOOT] for _ in range(20))
    assert sync_sources(v, ["Aaaa"]) == ["Aaaa"]  # not connected to it yet: anyone meanwhile
    learn_term(v, BOOT, 3)
    chosen = {tuple(sync_sources(v, ["Aaaa", BOOT, "Bbbb"])) for _ in range(200)}
    assert chosen == {("Aaaa",), (BOOT,), ("Bbbb",)}


def test_a_fresh_organiser_asks_planner_token_holders_first_several_at_once() -> None:
    boot = SwarmView(
        self_id=BOOT, role="bootstrap", planner_capable=False, started_at=0.0, bootstrap_id=BOOT
    )
    feed = Feed()
    members = [f"M{i:03d}" for i in range(28)]
    holders = [f"H{i:03d}" for i in range(MAX_TERM_ASKS + 1)]
    for peer in members:
        assert (
            boot.accept(feed("peer", peer, {**record(), "token": members_token(peer)}), 0.0) is None
        )
    for peer in holders:  # Feed gives them planner tokens
        assert boot.accept(feed("peer", peer, record()), 0.0) is None
    assert not boot.may_plan("M000") and boot.may_plan("H000")
    for _ in range(20):
        asked = sync_sources(boot, [*members, *holders])
        assert len(asked) == MAX_TERM_ASKS == len(set(asked)) and set(asked) <= set(holders)
    assert sync_sources(boot, [*members, "H000"]) == ["H000"]
    assert sync_sources(boot, members)[0] in members  # no holder connected: members meanwhile
    for holder in holders[:MAX_TERM_ASKS]:  # as many answers as holders asked at once
        assert not boot.term_anchored
        learn_term(boot, holder, None)  # a fresh swarm's holder knows no term: ours is current
    assert boot.term_anchored and boot.known_term() == 0
    assert len({sync_sources(boot, [*members, *holders])[0] for _ in range(200)}) > 10


def test_only_who_waits_on_the_term_syncs_fast_before_it_knows_it() -> None:
    holder, _ = make_view(anchor=None)  # make_view's views hold planner tokens
    assert sync_interval_s(holder) == UNANCHORED_SYNC_INTERVAL_S
    learn_term(holder, BOOT, 0)
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
    assert not term_only_from(member, BOOT)  # it never claims: the whole table at once
    boot = SwarmView(
        self_id=BOOT, role="bootstrap", planner_capable=False, started_at=0.0, bootstrap_id=BOOT
    )
    assert sync_interval_s(boot) == UNANCHORED_SYNC_INTERVAL_S


def test_before_it_knows_the_term_a_node_asks_for_the_term_only() -> None:
    v, _ = make_view(anchor=None)  # it holds a planner token: its election waits on the term
    assert term_only_from(v, BOOT) and not term_only_from(v, "Aaaa")
    learn_term(v, BOOT, 0)
    assert not term_only_from(v, BOOT)
    boot = SwarmView(
        self_id=BOOT, role="bootstrap", planner_capable=False, started_at=0.0, bootstrap_id=BOOT
    )
    feed = Feed()
    assert boot.accept(feed("peer", "Hold", record()), 0.0) is None
    assert (
        boot.accept(feed("peer", "Memb", {**record(), "token": members_token("Memb")}), 0.0) is None
    )
    assert term_only_from(boot, "Hold") and not term_only_from(boot, "Memb")
    learn_term(boot, "Hold", None)
    assert not term_only_from(boot, "Hold")
