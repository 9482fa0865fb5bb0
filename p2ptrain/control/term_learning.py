"""How a view learns the current term it measures claims against, from sync replies and the
organiser's record: the organiser's word anchors it (`anchor_term`); the organiser itself, after
a restart or a live holder's jump, takes its planner-token holders' low median (`learn_term`,
control/term_votes.py). Until it is anchored a candidate never claims (control/candidacy.py),
and the terms it cannot follow yet are dropped quietly (control/terms.py)."""

from __future__ import annotations

from p2ptrain.control.view import SwarmView


def anchor_term(view: SwarmView, term: int, now: float | None = None) -> None:
    """The organiser's current term (a bootstrap's sync reply, bound alike), which a fresh node
    measures claims against; a term new to us, learnt at `now`, counts as a claim heard then."""
    view.terms.anchor(term, view.known_term(), now)  # waited on: no claim before it


def learn_term(view: SwarmView, peer: str, term: int | None, now: float | None = None) -> None:
    """A sync reply's term (None: not anchored yet), at `now`: the organiser's only, or for the
    organiser itself, after a restart or a live holder's jump (terms.py), its planner-token
    holders' (none: its own) low median (term_votes.py)."""
    if peer == view.bootstrap_id and term is not None:
        anchor_term(view, term, now)
    elif view.self_id == view.bootstrap_id and not view.term_anchored and view.may_plan(peer):
        at = view.started_at if now is None else now
        holders = sum(view.may_plan(p) for p in view.live_members(at))
        said = view.known_term() if term is None else term
        if (voted := view.terms.vote(peer, said, at, holders)) is not None:
            anchor_term(view, voted, now)
