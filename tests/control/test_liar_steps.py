"""A member's step is its own word: one liar's step neither freezes the planner's switching near
a run's end it made up (control/run_end.py: steps_left) nor skips the first plan's min_peers
gate (SwarmView.run_planned: authority only). Pure rules, a fake clock."""

from __future__ import annotations

from collections.abc import Mapping

import trio

from p2ptrain.control.membership import Member, Membership
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker, min_steps_to_switch
from p2ptrain.control.run_end import steps_left
from p2ptrain.control.waiting import waiting_for
from p2ptrain.records import PeerMetrics, PeerRecord, Plan, RunSpec
from tests.control.test_run_end import RUN, planner_of, step
from tests.control.test_view import ME, A, B, C, make_view, plan, record

LIAR = "Llll"
SPARE = "Ssss"
PLAN = Plan(1, 1, A, 1, ((A,), (B,), (C,)), (SPARE,), {}, 1.0)


def member(reported: int | None, role: str = "trainer") -> Member:
    metrics = None if reported is None else PeerMetrics(step=reported)
    return Member(PeerRecord((), role, True, "0", {}), 0.0, metrics)


def members(steps: Mapping[str, int | None]) -> Membership:
    table = Membership()
    for peer, reported in steps.items():
        table[peer] = member(reported)
    return table


def test_steps_left_counts_the_placed_peers_low_median_within_the_run() -> None:
    run = RUN.replace(steps=1000)  # last step 999
    honest = {A: 100, B: 101, C: 99}
    assert steps_left(members(honest), run, PLAN) == 999 - 100
    assert steps_left(members({}), run, PLAN) is None
    assert steps_left(members({A: None, SPARE: 500}), run, PLAN) is None  # a spare's word: none
    # a spare's huge step, one placed liar near the end, another past it: the honest median
    lying = {**honest, SPARE: 10**15, B: 998}
    assert steps_left(members(lying), run, PLAN) == 999 - 100
    assert steps_left(members({**honest, C: 10**15}), run, PLAN) == 999 - 100
    assert steps_left(members({A: 100, B: 998}), run, PLAN) == 999 - 100  # low median of two
    assert steps_left(members({A: 999, B: 998, C: 100}), run, PLAN) == 1  # most say the end
    # a report made at another place (an earlier plan's: a spare since placed) does not count
    stale = members(honest)
    stale[C] = Member(PeerRecord((), "trainer", True, "0", {}), 0.0, PeerMetrics(step=990, stage=1))
    assert steps_left(stale, run, PLAN) == 999 - 100  # of A's 100 and B's 101 (with it: 101)
    placed = members(honest)
    placed[C] = Member(
        PeerRecord((), "trainer", True, "0", {}), 0.0, PeerMetrics(step=990, stage=0, replica=2)
    )
    assert steps_left(placed, run, PLAN) == 999 - 101  # at its place: it counts


def test_a_liars_step_keeps_the_planners_switching_open() -> None:
    """A spare's step 10**15 (or a placed peer's steps - 2) made every drift, compute or
    confirmation switch of the plan "too near the run's end"."""
    from p2ptrain.control.planning.placement import Placement

    run = RUN.replace(steps=1000)
    view, _ = make_view(me=ME, peers=())
    for peer, reported in {A: 100, B: 998, C: 101, SPARE: 10**15}.items():
        view.members[peer] = member(reported)
    maker = PlanMaker(view, ME)
    left = steps_left(view.members, run, PLAN)
    assert left is not None and left > min_steps_to_switch(run)
    faster = Placement(1, ((A,), (C,), (B,)), (SPARE,), 0.1)
    assert maker._pays_to_switch(faster, PLAN, 1.0, run)


def test_members_steps_never_put_the_run_under_way() -> None:
    """Two members' "step 5" skipped the first plan's min_peers, and half the trainers' still
    did: a step is its member's own word. Only a plan of the run, signed by a planner-token
    holder, or the organiser's record saying one was out, puts the run under way."""
    v, feed = make_view(me=ME, peers=(A, B, C))
    v.run = RUN.replace(min_peers=9)
    for peer in (A, B, C):  # every member lies: none of their words counts
        assert v.accept(feed("telemetry", peer, step(1320)), 1.0) is None
    assert not v.run_planned and waiting_for(v, 1.0).kind == "peers"
    # a member's record saying "planned" is not the organiser's
    assert v.accept(feed("peer", A, {**record(), "planned": True}), 1.1) is None
    assert not v.run_planned
    # a plan signed by a peer without a planner token: refused, and nothing under way
    assert v.accept(feed("peer", LIAR, {**record(), "token": None}), 1.2) is None
    assert v.accept(feed("plan", LIAR, plan(LIAR, 1, 1)), 1.3) is not None
    assert not v.run_planned and waiting_for(v, 1.3).kind == "peers"
    # the organiser's record says a plan was out (a restarted planner holds none)
    organiser = v.bootstrap_id
    assert organiser is not None
    said = {**record("bootstrap"), "planned": True}
    assert v.accept(feed("peer", organiser, said), 1.4) is None
    assert v.run_planned and waiting_for(v, 1.4).kind != "peers"


def test_a_planner_token_holders_plan_puts_the_run_under_way_followed_or_not() -> None:
    """A plan made by a holder of the organiser's planner token is the run's first plan, even
    one from a planner this node does not follow (a former planner's, pulled by sync)."""
    v, feed = make_view(me=ME, peers=(A, B, C))
    v.run = RUN.replace(min_peers=5)
    assert v.accept(feed("claim", A, {"term": 1}), 0.1) is None
    drop = v.accept(feed("plan", B, plan(B, 1, 1)), 0.2)  # not the planner we follow
    assert drop is not None and v.plan is None
    assert v.run_planned and waiting_for(v, 0.2).kind != "peers"


def test_a_liars_step_0_does_not_skip_the_first_plans_min_peers() -> None:
    """One member's "step 0" before any plan let the planner plan 3 peers of min_peers 4."""
    v, feed, _, tick = planner_of((B, C))
    v.run = RunSpec.replace(RUN, min_peers=4)

    async def scenario() -> list[bool]:
        waited = await tick(1.0)  # a fresh run: 3 of 4
        assert v.accept(feed("telemetry", B, step(0)), 1.1) is None
        lied = await tick(1.2 + PLAN_DEBOUNCE_S + 0.1)
        assert v.accept(feed("telemetry", C, step(1320)), 5.0) is None  # both "train"
        both = await tick(5.1 + PLAN_DEBOUNCE_S + 0.1)
        assert v.bootstrap_id is not None  # the organiser: a plan of the run was out
        said = {**record("bootstrap"), "planned": True}
        assert v.accept(feed("peer", v.bootstrap_id, said), 7.0) is None
        await tick(7.1)
        return [waited, lied, both, await tick(7.2 + PLAN_DEBOUNCE_S + 0.1)]

    assert trio.run(scenario) == [False, False, False, True]
    assert v.plan is not None and v.plan.peers() == {A, B, C}
