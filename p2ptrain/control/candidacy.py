"""Our candidacy for the planner role: when this peer claims it (`should_claim`), and whether a
peer stays (`stays`: alive, and not stopping). The view follows the claims it hears
(control/view.py); the loop that claims and plans: control/election.py.

Among live planner-capable members, an incumbent planner keeps its term while it lives (unless
it sees far fewer peers than a candidate: planner_sight.py): no one claims while a live planner
is known, or while a claim it could not follow yet is fresh. When none is alive, the live
candidate with the smallest peer id claims term = highest seen + 1 (the others back off by rank:
control/terms.py), and none before it knows the current term (control/term_learning.py).

The run's protocol level is its organiser's (the bootstrap's record; records/peer.py
PROTOCOL_LEVEL): candidates of that level come first in the ranking, and a live planner of
another level is replaced by them as if none stood. A planner plans only members of its own
level, so during an upgrade an old planner that kept the role left every upgraded member
waiting until it stopped; nodes of before levels, or an organiser of none, rank as before.
"""

from __future__ import annotations

from p2ptrain.control.view import SwarmView
from p2ptrain.records import PROTOCOL_LEVEL

ELECTION_GRACE_S = 5.0  # listen for an incumbent before claiming after start


def should_claim(view: SwarmView, now: float) -> bool:
    """True when this peer must claim the planner role now."""
    if not view.may_plan(view.self_id) or view.planner == view.self_id or view.finished:
        return False
    if view.own_health.leaving:
        return False  # we stop (control/handover.py may keep us up a while): no role to take
    if not view.term_anchored:
        return False  # a claim from behind the current term would only be refused
    if now - view.started_at < ELECTION_GRACE_S:
        return False
    level = run_level(view)
    if _keeps_role(view, view.planner, level, now):
        view.terms.lost_at = None
        return False
    dead_after_s = view.members.dead_after_s(now)
    capable = [p for p in view.members if view.may_plan(p) and stays(view, p, now)]
    ranked = sorted({view.self_id, *capable}, key=lambda p: (off_level(view, p, level), p))
    rank = ranked.index(view.self_id)
    if not view.terms.turn_came(rank, now, dead_after_s):
        return False  # a smaller candidate's turn first: it may never claim, so not for ever
    # someone claims a term we could not follow yet: hear it out first
    return not view.terms.hearing_out(view.term, now, dead_after_s)


def _keeps_role(view: SwarmView, planner: str | None, level: int | None, now: float) -> bool:
    """A live planner (one whose planner token expired is none) keeps the role, unless it is of
    another level than the run's and we are not."""
    if planner is None or not view.may_plan(planner) or not stays(view, planner, now):
        return False
    return not off_level(view, planner, level) or off_level(view, view.self_id, level)


def stays(view: SwarmView, peer: str, now: float) -> bool:
    """Alive, and not stopping: a planner that said it stops is replaced at once, not after
    DEAD_AFTER_S of silence (its last word: control/publishing.py, health `leaving`)."""
    member = view.members.get(peer)
    leaving = member is not None and member.health is not None and member.health.leaving
    return view.is_alive(peer, now) and not leaving


def run_level(view: SwarmView) -> int | None:
    """The run's protocol level: its organiser's (ours if we are the bootstrap); None while its
    record has not come, or if it states none (a bootstrap of before levels)."""
    if view.self_id == view.bootstrap_id:
        return PROTOCOL_LEVEL
    organiser = view.members.get(view.bootstrap_id) if view.bootstrap_id else None
    return None if organiser is None else organiser.record.protocol


def off_level(view: SwarmView, peer: str, level: int | None) -> bool:
    """Does `peer` state a protocol level other than the run's `level`? (No level on either
    side, or no record: not off.)"""
    if level is None:
        return False
    if peer == view.self_id:
        return level != PROTOCOL_LEVEL
    member = view.members.get(peer)
    return member is not None and member.record.protocol not in (None, level)
