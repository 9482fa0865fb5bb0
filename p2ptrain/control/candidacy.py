"""Our candidacy for the planner role: when this peer claims it (`should_claim`), and whether a
peer stays (`stays`: alive, and not stopping). The view follows the claims it hears
(control/view.py); the loop that claims and plans: control/election.py.

Among live planner-capable members, an incumbent planner keeps its term while it lives (unless
it sees far fewer peers than a candidate: planner_sight.py): no one claims while a live planner
is known, or while a claim it could not follow yet is fresh. When none is alive, the live
candidate with the smallest peer id claims term = highest seen + 1 (the others back off by rank:
control/terms.py), and none before it knows the current term (control/term_learning.py).
"""

from __future__ import annotations

from p2ptrain.control.view import SwarmView

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
    planner = view.planner  # one whose planner token expired is none
    if planner is not None and view.may_plan(planner) and stays(view, planner, now):
        view.terms.lost_at = None
        return False
    dead_after_s = view.members.dead_after_s(now)
    capable = [p for p in view.members if view.may_plan(p) and stays(view, p, now)]
    rank = sorted({view.self_id, *capable}).index(view.self_id)
    if not view.terms.turn_came(rank, now, dead_after_s):
        return False  # a smaller candidate's turn first: it may never claim, so not for ever
    # someone claims a term we could not follow yet: hear it out first
    return not view.terms.hearing_out(view.term, now, dead_after_s)


def stays(view: SwarmView, peer: str, now: float) -> bool:
    """Alive, and not stopping: a planner that said it stops is replaced at once, not after
    DEAD_AFTER_S of silence (its last word: control/publishing.py, health `leaving`)."""
    member = view.members.get(peer)
    leaving = member is not None and member.health is not None and member.health.leaving
    return view.is_alive(peer, now) and not leaving
