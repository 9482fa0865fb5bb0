"""A live planner that sees far fewer peers than a candidate loses the role to it
(control/planner_sight.py); one that sees as many, or says nothing, keeps it."""

from __future__ import annotations

from p2ptrain.control import view as view_mod
from p2ptrain.control.candidacy import ELECTION_GRACE_S, should_claim
from p2ptrain.control.planner_sight import BLIND_AFTER_S, PlannerSight, margin, pool_size
from p2ptrain.records import Claim, RunSpec
from tests.control.test_view import ME, A, make_view, record

OTHERS = tuple(f"Peer{i:02d}" for i in range(9))  # sort after A and ME
T0 = ELECTION_GRACE_S + 1.0


def watching(sees: int, planner: str = A):
    """Our view of A (the planner, term 1) and 9 more members, and A's claim saying `sees`."""
    v, feed = make_view(me=ME, peers=(A, *OTHERS))
    v.run = RunSpec()
    assert v.accept(feed("claim", planner, {"term": 1, "sees": sees}), T0) is None
    return v, feed


def keep_alive(v, feed, now: float, sees: int) -> None:
    """Everyone talks at `now`, the planner with a claim saying `sees`."""
    for peer in OTHERS:
        v.accept(feed("peer", peer, record()), now)
    assert v.accept(feed("claim", A, {"term": 1, "sees": sees}), now) is None


def watch(v, feed, sight, start: float, end: float, sees: int) -> list[bool]:
    """Everyone talks every 5 s from `start` to `end`, the planner saying `sees`: what the
    sight says each time (at `end` last)."""
    said, t = [], start
    while t <= end:
        keep_alive(v, feed, t, sees)
        said.append(sight.takes_over(t))
        t = min(t + 5.0, end) if t < end else end + 1
    return said


def test_the_claim_says_how_many_peers_the_planner_sees_and_old_claims_say_nothing():
    assert Claim.from_dict({"term": 2}).sees == 0
    assert Claim.from_dict(Claim(2, sees=7).to_dict()) == Claim(2, sees=7)
    assert "sees" not in Claim(2).to_dict()


def test_a_planner_blind_to_most_of_the_swarm_loses_the_role_after_a_while():
    v, feed = watching(sees=2)
    assert pool_size(v, T0) == 11  # the planner, the 9 others and ourselves
    sight = PlannerSight(v)
    assert not should_claim(v, T0)  # a live planner keeps its term
    assert not any(watch(v, feed, sight, T0, T0 + BLIND_AFTER_S - 0.1, sees=2))
    assert watch(v, feed, sight, T0 + BLIND_AFTER_S, T0 + BLIND_AFTER_S, sees=2) == [True]
    assert v.claim() == 2 and v.planner == ME


def test_a_planner_that_catches_up_restarts_the_clock():
    v, feed = watching(sees=2)
    sight = PlannerSight(v)
    assert not any(watch(v, feed, sight, T0, T0 + 60, sees=2))
    almost_all = 11 - margin(11) + 1
    assert watch(v, feed, sight, T0 + 61, T0 + 61, sees=almost_all) == [False]
    blind_again = T0 + 62  # the clock starts again here, not at T0
    assert not any(watch(v, feed, sight, blind_again, blind_again + BLIND_AFTER_S - 1, sees=2))
    assert watch(v, feed, sight, blind_again + BLIND_AFTER_S, blind_again + BLIND_AFTER_S, 2)[-1]


def test_a_planner_that_sees_about_as_many_or_says_nothing_keeps_the_role():
    for sees in (0, 11, 11 - margin(11) + 1, 40):  # 0: a claim from before the field
        v, feed = watching(sees=sees)
        sight = PlannerSight(v)
        assert not any(watch(v, feed, sight, T0, T0 + 3 * BLIND_AFTER_S, sees)), sees


def test_two_sides_of_a_partition_do_not_take_the_role_from_each_other_in_turn():
    # we saw 11 and took the role from a planner that saw 2; it, seeing its 2, reads our claim
    # saying 11 and does not take it back however long it waits
    v, feed = make_view(me=OTHERS[0], peers=(ME,))
    v.run = RunSpec()
    sight = PlannerSight(v)
    t = T0
    while t < T0 + 3 * BLIND_AFTER_S:
        assert v.accept(feed("claim", ME, {"term": 2, "sees": 11}), t) is None
        assert not sight.takes_over(t)
        t += 5.0
    assert v.planner == ME


def test_a_dead_planner_is_left_to_the_ordinary_failover():
    v, feed = watching(sees=2)
    sight = PlannerSight(v)
    assert not sight.takes_over(T0)
    late = T0 + BLIND_AFTER_S + view_mod.DEAD_AFTER_S
    for peer in OTHERS:  # the others talk, the planner is silent
        v.accept(feed("peer", peer, record()), late)
    assert not v.is_alive(A, late)
    assert not sight.takes_over(late)
    assert should_claim(v, late)  # we are the smallest live candidate: the ordinary failover
