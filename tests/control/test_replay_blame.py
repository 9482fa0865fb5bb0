"""Replayed blame (control/intake.py): a real signed plan of an earlier planner, served again by
another peer (sync, a plan pull, a relayed copy) to a node that never heard that planner's claim,
must not get its author blamed; and no one envelope is ever blamed twice."""

from __future__ import annotations

from typing import Any, cast

from p2ptrain.control.intake import Intake
from p2ptrain.control.state import NodeState
from p2ptrain.control.wire import Envelope
from tests.control.test_view import A, B, C, Feed, make_view, plan

NOW = 1.0


def following_b() -> tuple[NodeState, Intake, Feed]:
    """A node that follows B (term 1) and never heard A claim anything."""
    view, feed = make_view()
    assert view.accept(feed("claim", B, {"term": 1}), NOW) is None
    state = NodeState(
        seed=bytes(32),
        role="control-only",
        peer_id=view.self_id,
        host=cast(Any, None),
        view=view,
        hardware={},
    )
    return state, Intake(state), feed


def old_plan_of_a(feed: Feed) -> Envelope:
    """A's real signed plan of term 1, from when A planned (in views that heard its claim)."""
    return feed("plan", A, plan(A, 1, 1))


def test_an_old_plan_served_by_another_peer_blames_nobody_however_often() -> None:
    state, intake, feed = following_b()
    env = old_plan_of_a(feed)
    for via in ("sync", "sync", "/p2ptrain/control", "sync"):
        assert not intake.apply(env, b"", C, via, NOW)
    penalties = state.view.penalties
    assert penalties.score(A) == 0 and penalties.score(C) == 0
    assert state.view.is_alive(A, NOW) and state.view.plan is None


def test_a_non_planners_own_plan_is_blamed_once_per_envelope() -> None:
    state, intake, feed = following_b()
    env = old_plan_of_a(feed)
    assert not intake.apply(env, b"", A, "/p2ptrain/control", NOW)  # A sent it itself
    blamed = state.view.penalties.score(A)
    assert blamed > 0
    for sender in (A, C, A):  # the same envelope again, from anyone: a duplicate
        assert not intake.apply(env, b"", sender, "sync", NOW)
    assert state.view.penalties.score(A) == blamed
    assert not state.view.penalties.is_blocked(A, NOW)
    assert state.view.penalties.score(C) == 0


def test_a_refused_envelope_sent_again_is_not_blamed_again() -> None:
    """Any blamed refusal: its seq is noted, so a copy served again is a harmless duplicate that
    no one forwards or counts as of use."""
    state, intake, feed = following_b()
    jump = feed("claim", C, {"term": 9})  # past the term we know + MAX_TERM_STEP
    assert not intake.apply(jump, b"", C, "/p2ptrain/control", NOW)
    blamed = state.view.penalties.score(C)
    assert blamed > 0
    for _ in range(3):
        assert not intake.apply(jump, b"", C, "/p2ptrain/control", NOW)
    assert state.view.penalties.score(C) == blamed
    assert not state.view.seqs.knows(jump)
