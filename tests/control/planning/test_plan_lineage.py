"""The live planner fills each plan's lineage from the plan it replaces (control/planning/plan_maker.py)."""

from __future__ import annotations

import trio

from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.control.view import SwarmView
from p2ptrain.records import Plan, RunSpec
from tests.control.test_view import A, B, C, make_view, record


def planned(v: SwarmView, maker: PlanMaker, now: float) -> Plan:
    """Tick the planner through a membership change's debounce; the plan it published."""

    async def tick() -> None:
        await maker.tick(now, [])
        assert await maker.tick(now + PLAN_DEBOUNCE_S + 0.1, [])

    trio.run(tick)
    assert v.plan is not None
    return v.plan


def test_the_planner_continues_its_lineage_and_a_new_term_forks_it() -> None:
    v, feed = make_view(me=A, peers=(B,))
    v.run = RunSpec().replace(
        stages=1, n_layer=2, min_peers=1, compute_aware=False
    )  # no workers to time
    assert v.accept(feed("peer", B, record()), 0.0) is None
    v.claim()
    maker = PlanMaker(v, A)
    first = planned(v, maker, 1.0)
    assert len(first.lineage) == 1 and first.lineage[0][1] == first.epoch
    assert v.accept(feed("peer", C, record()), 5.0) is None  # a join: a new epoch
    second = planned(v, maker, 5.0)
    assert second.key == (first.term, first.epoch + 1)
    assert second.lineage == ((first.lineage[0][0], second.epoch),)
    assert second.state_rank(first.state_tag) == 0
    # re-elected under a new term (as after losing the role): a new id, the old one behind it
    v.claim()
    third = planned(v, PlanMaker(v, A), 10.0)
    assert third.term == second.term + 1
    assert third.lineage[0][0] != second.lineage[0][0] and third.lineage[1:] == second.lineage
    assert third.state_rank(second.state_tag) == 1


def test_two_planners_elected_apart_make_different_lineages_of_one_ancestor() -> None:
    """A partition: each half's view holds the same last plan, and each elects its planner."""
    ancestor: Plan | None = None
    halves = []
    for me, other in ((A, B), (B, A)):
        v, _ = make_view(me=me, peers=(other,))
        v.run = RunSpec().replace(
            stages=1, n_layer=2, min_peers=1, compute_aware=False
        )  # no workers to time
        if ancestor is None:
            v.claim()
            ancestor = planned(v, PlanMaker(v, me), 1.0)
        else:
            v.adopt_own_plan(ancestor)
        v.claim()  # the half's new planner (A's own re-election on its side)
        v.members.pop(other)  # the other half is gone
        halves.append(planned(v, PlanMaker(v, me), 20.0))
    assert ancestor is not None
    left, right = halves
    assert left.lineage[0][0] != right.lineage[0][0]
    assert left.state_rank(ancestor.state_tag) == right.state_rank(ancestor.state_tag) == 1
    assert left.state_rank(right.state_tag) is None and right.state_rank(left.state_tag) is None
