"""Whom a node's pull sync (control/sync.py) asks, how often, and for what: a random connected
live member every SYNC_INTERVAL_S for its envelopes; but until the node knows the current term
(control/term_learning.py), if its election waits on it, whoever can tell it, every second, for
the term only."""

from __future__ import annotations

import random

from p2ptrain.control.term_votes import MAX_TERM_ASKS
from p2ptrain.control.view import SwarmView

SYNC_INTERVAL_S = 5.0
UNANCHORED_SYNC_INTERVAL_S = 1.0  # until we learnt the current term, if we wait on it


def sync_sources(view: SwarmView, connected_live: list[str]) -> list[str]:
    """Whom to sync from next: a random connected live member, but, until we know the current
    term (term_learning.learn_term), whoever can tell us (term_only_from): the organiser, or, for
    the organiser itself, up to MAX_TERM_ASKS planner-token holders at once. No holder may
    claim before it knows the organiser's term, and the organiser knows none before a
    holder's reply: a fresh bootstrap picking one member at a time at random among 32 (3
    holders) on one loaded machine, each unanswered sync 10 s, knew the term 48 s after the
    start, and the swarm's election waited on it."""
    if not connected_live:
        return []
    if not view.term_anchored:
        if view.bootstrap_id in connected_live:
            return [str(view.bootstrap_id)]
        if view.self_id == view.bootstrap_id:
            holders = [p for p in connected_live if view.may_plan(p)]
            if holders:
                return random.sample(holders, min(MAX_TERM_ASKS, len(holders)))
    return [random.choice(connected_live)]


def waits_on_term(view: SwarmView) -> bool:
    """Does our election wait on the organiser's term? The organiser's and the planner-token
    holders' do (they may not claim before it); a member that may not plan never claims."""
    return view.may_plan(view.self_id) or view.self_id == view.bootstrap_id


def term_only_from(view: SwarmView, peer: str) -> bool:
    """Do we ask `peer` for the current term only (no envelopes)? While our election waits on
    it, of whoever can tell us: holders pulling the organiser's whole table every second while
    it and they waited on each other's word kept a 32-member swarm on one machine from an
    election for 70 s. The table comes from the next sync, once we know the term; a member
    that never claims pulls it at once."""
    if view.term_anchored or not waits_on_term(view):
        return False
    return peer == view.bootstrap_id or (view.self_id == view.bootstrap_id and view.may_plan(peer))


def sync_interval_s(view: SwarmView) -> float:
    """Fast until we know the current term, if our election waits on it; a member that may not
    plan asks at the steady pace (31 of them asking every second kept the bootstrap busy)."""
    fast = waits_on_term(view) and not view.term_anchored
    return UNANCHORED_SYNC_INTERVAL_S if fast else SYNC_INTERVAL_S
