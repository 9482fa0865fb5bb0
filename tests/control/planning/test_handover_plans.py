"""A stopping peer that alone holds a stage stays one plan longer as a spare, a donor of its
state (control/handover.py), and the plan drops it, its placement unchanged, once it is gone."""

from __future__ import annotations

import trio

from p2ptrain.control.candidacy import should_claim
from p2ptrain.control.handover import (
    Donors,
    donors_of,
    handed_over,
    holds_alone,
    successor_possible,
)
from p2ptrain.control.membership import DEAD_AFTER_S
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.control.settings import HANDOVER_LIMIT_S
from p2ptrain.control.view import SwarmView
from p2ptrain.records import Health, Plan, RunSpec
from p2ptrain.records.peer import LEAVING_REASON, LEFT_REASON, QUIT_REASON
from tests.control.test_view import A, B, C, Feed, make_view

LEAVING = {"ok": False, "reason": LEAVING_REASON}


def plan_after(maker: PlanMaker, now: float) -> bool:
    async def tick() -> bool:
        await maker.tick(now, [])  # a membership change: debounced
        return await maker.tick(now + PLAN_DEBOUNCE_S + 0.1, [])

    return trio.run(tick)


def planned_by_a(stages: int) -> tuple[SwarmView, Feed, PlanMaker, Plan]:
    """A, B and C, a run of `stages` stages, and A's first plan as their planner."""
    v, feed = make_view(me=A, peers=(B, C))
    v.run = RunSpec().replace(stages=stages, n_layer=2, min_peers=1, compute_aware=False)
    v.claim()
    maker = PlanMaker(v, A)
    assert plan_after(maker, 1.0) and v.plan is not None
    return v, feed, maker, v.plan


def test_a_leaving_lone_holder_is_kept_as_a_spare_until_it_is_gone() -> None:
    v, feed, maker, first = planned_by_a(stages=2)
    assert first is not None and len(first.pipelines) == 1 and len(first.spares) == 1
    leaver = next(p for p in first.pipelines[0] if p != A)
    others = sorted({A, B, C} - {leaver})
    assert holds_alone(first, leaver, lambda p: p in others)

    # it says it stops: planned around, but kept as a spare of the next plan
    assert v.accept(feed("telemetry", leaver, {"links": {}, "health": LEAVING}), 3.0) is None
    assert plannable_members(v, 3.0) == others
    assert donors_of(v, first, others, 3.0) == [leaver]
    assert plan_after(maker, 3.0)
    second = v.plan
    assert second is not None and second.key != first.key
    assert leaver in second.spares and all(leaver not in p for p in second.pipelines)
    assert second.donors == (leaver,)  # no copy duty is its (worker/resume/copy_server.py)
    # the blocks it hands over: its stage of the first plan, where the start agreement hears
    # it first (worker/resume/covers.py), and nowhere else
    stage = first.pipelines[0].index(leaver)
    held = first.layer_ranges(2)[stage]
    assert second.donor_ranges() == {leaver: held}
    assert sorted(p for pipeline in second.pipelines for p in pipeline) == others
    assert leaver in dict(second.data_addrs)
    # a tick with nothing new publishes nothing: the donor is no membership change
    heard = 3.0 + DEAD_AFTER_S - 1
    for peer in others:
        if peer != A:
            assert v.accept(feed("telemetry", peer, {"links": {}}), heard) is None
    assert not trio.run(maker.tick, heard, [])

    # gone: the same placement again, without it
    gone = 3.0 + DEAD_AFTER_S + 1
    assert not v.is_alive(leaver, gone)
    assert trio.run(maker.tick, gone, [])
    third = v.plan
    assert third is not None and third.key != second.key
    assert third.pipelines == second.pipelines and leaver not in third.peers()
    assert third.reason == "members" and third.donors == () and third.donor_blocks == {}


def test_a_leaving_peer_whose_stage_another_replica_holds_is_no_donor() -> None:
    v, feed, maker, first = planned_by_a(stages=1)
    assert first is not None and len(first.pipelines) == 3  # three replicas of one stage
    assert v.accept(feed("telemetry", B, {"links": {}, "health": LEAVING}), 3.0) is None
    assert donors_of(v, first, [A, C], 3.0) == []
    assert plan_after(maker, 3.0)
    assert v.plan is not None and B not in v.plan.peers()


def test_the_leaving_node_waits_for_a_later_plan_and_its_worker_s_spare_session() -> None:
    v, feed = make_view(me=B, peers=(A, C))
    v.run = RunSpec().replace(stages=2, n_layer=2, min_peers=1, compute_aware=False)
    placed = {"term": 1, "epoch": 1, "planner": A, "stages": 2, "pipelines": [[A, B]]}
    body = {**placed, "spares": [C], "data_addrs": {}, "cost_s": 1.0}
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert v.accept(feed("plan", A, body), 1.0) is None
    assert v.plan is not None
    first = v.plan.key
    assert successor_possible(v, first, 1.0)  # C may take the stage, A may plan it
    assert not handed_over(v, first, (1, 1, "training", 9))  # no later plan yet
    later = {**body, "epoch": 2, "pipelines": [[A, C]], "spares": [B]}
    assert v.accept(feed("plan", A, later), 2.0) is None
    assert not handed_over(v, first, (1, 2, "joining", 9))  # agreeing, or serving its state
    assert handed_over(v, first, (1, 2, "spare", 9))
    assert successor_possible(v, first, 2.0)  # A and C, placed by it, stay
    assert v.accept(feed("telemetry", C, {"links": {}, "health": LEAVING}), 2.5) is None
    assert successor_possible(v, first, 2.5)  # A still does
    assert v.accept(feed("telemetry", A, {"links": {}, "health": LEAVING}), 2.5) is None
    assert not successor_possible(v, first, 2.5)  # every peer it places is stopping too
    assert handed_over(v, first, (1, 2, "waiting", 9))  # its spare's session is over
    placed_again = {**body, "epoch": 3, "pipelines": [[B, C]], "spares": [A]}
    assert v.accept(feed("plan", A, placed_again), 3.0) is None
    assert not handed_over(v, first, (1, 3, "waiting", 9))  # made before our word arrived
    dropped = {**body, "epoch": 4, "pipelines": [[A, C]], "spares": []}
    assert v.accept(feed("plan", A, dropped), 3.0) is None
    assert handed_over(v, first, (1, 1, "training", 9))  # not kept: nothing to hand over


def test_no_successor_when_every_other_peer_is_leaving_too() -> None:
    v, feed = make_view(me=B, peers=(A, C))
    for peer in (A, C):
        assert v.accept(feed("telemetry", peer, {"links": {}, "health": LEAVING}), 1.0) is None
    assert not successor_possible(v, (1, 1), 1.0)


def test_a_donor_that_stays_is_dropped_after_the_hand_over_s_limit() -> None:
    v, feed = make_view(me=A, peers=(B, C))
    placed = {"term": 1, "epoch": 1, "planner": A, "stages": 2, "pipelines": [[A, B]]}
    body = {**placed, "spares": [C], "data_addrs": {}, "cost_s": 1.0}
    v.claim()
    assert v.accept(feed("telemetry", B, {"links": {}, "health": LEAVING}), 1.0) is None
    current = Plan.from_dict({**body, "term": v.term})
    donors = Donors()
    assert donors.review(v, current, [A, C], 1.0) == ([B], [])
    donors.kept([B], 1.0)
    # it keeps talking (alive) but never leaves: kept until the limit, then dropped
    late = 1.0 + HANDOVER_LIMIT_S + 1
    assert v.accept(feed("telemetry", B, {"links": {}, "health": LEAVING}), late) is None
    assert donors.review(v, None, [A, C], late - 2) == ([B], [])
    assert donors.review(v, None, [A, C], late) == ([], [B])
    donors.kept([], late)
    assert donors.review(v, None, [A, C], late) == ([], [])


def test_a_stopping_node_neither_claims_the_planner_role_nor_plans() -> None:
    """A node kept up by a hand-over would otherwise publish a plan without itself, which its
    own hand-over would read as "nothing to hand over"."""
    v, _ = make_view(me=A, peers=(B, C))
    v.run = RunSpec().replace(stages=2, n_layer=2, min_peers=1, compute_aware=False)
    v.own_health = Health(False, LEAVING_REASON)
    assert not should_claim(v, 100.0)  # A has the smallest id: it would claim otherwise
    v.claim()  # it held the role when it was signalled
    maker = PlanMaker(v, A)
    assert not plan_after(maker, 1.0) and v.plan is None


KEPT = {"term": 1, "epoch": 2, "planner": A, "stages": 2, "pipelines": [[A, C]]}


def kept_donor(epoch: int = 2) -> tuple[SwarmView, Feed, Plan, Donors]:
    """A's plan (epoch `epoch`) keeps B, which said it stops, as a donor since 1.0."""
    v, feed = make_view(me=A, peers=(B, C))
    plan = Plan.from_dict({**KEPT, "epoch": epoch, "spares": [B], "data_addrs": {}, "cost_s": 1.0})
    assert v.accept(feed("telemetry", B, {"links": {}, "health": LEAVING}), 1.0) is None
    donors = Donors()
    donors.kept([B], 1.0)
    return v, feed, plan, donors


def test_a_donor_that_says_it_exits_is_forgotten_at_once_and_none_is_inherited() -> None:
    v, feed, plan, donors = kept_donor()
    assert donors.review(v, plan, [A, C], 2.0) == ([B], [])
    left = {"ok": False, "reason": LEFT_REASON}
    assert v.accept(feed("telemetry", B, {"links": {}, "health": left}), 2.0) is None
    assert v.is_alive(B, 2.5)  # alive still, by its silence: its word decides
    # forgotten, no re-issue for it: it is done, and no worker waits on it any more
    assert donors.review(v, plan, [A, C], 2.5) == ([], [])
    # a predecessor's plan keeping B: a new planner does not inherit its donor
    theirs = Plan.from_dict({**KEPT, "planner": C, "spares": [B], "data_addrs": {}, "cost_s": 1.0})
    assert donors_of(v, theirs, [A, C], 2.5) == []


def test_a_donor_that_exits_without_handing_over_is_re_issued_out_at_once() -> None:
    """A second signal or the time limit: its last word says it quits, and the planner's next
    plan drops it now instead of after its silence (a plan naming a dead spare holds every
    worker's start agreement up)."""
    v, feed, plan, donors = kept_donor()
    quits = {"ok": False, "reason": QUIT_REASON}
    assert v.accept(feed("telemetry", B, {"links": {}, "health": quits}), 2.0) is None
    assert v.is_alive(B, 2.5)
    assert donors.review(v, plan, [A, C], 2.5) == ([], [B])  # re-issued without it
    assert donors_of(v, plan, [A, C], 2.5) == []  # and no donor again


def test_a_donor_that_handed_over_under_an_older_plan_is_re_issued_out_of_the_newer() -> None:
    """Its word names the plan it handed over under; a newer plan (made before the word came)
    names it still, and a worker of that plan would wait on it: re-issued without it, not
    forgotten."""
    v, feed, newer, donors = kept_donor(epoch=3)
    under_older = {"ok": False, "reason": LEFT_REASON, "plan": [1, 2]}
    assert v.accept(feed("telemetry", B, {"links": {}, "health": under_older}), 2.0) is None
    assert donors.review(v, newer, [A, C], 2.5) == ([], [B])
    under_this = {"ok": False, "reason": LEFT_REASON, "plan": [1, 3]}
    donors.kept([B], 1.0)
    assert v.accept(feed("telemetry", B, {"links": {}, "health": under_this}), 3.0) is None
    assert donors.review(v, newer, [A, C], 3.5) == ([], [])  # done: forgotten, no re-issue
