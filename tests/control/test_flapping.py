"""Damping for members that flap in and out of the plannable set (control/flapping.py), with a
fake clock: a member flipping its health, its liveness or its role no longer changes the set
each flip; a join, and a single return after a quiet spell, still count at once."""

from __future__ import annotations

import itertools

import trio

from p2ptrain.control.flapping import (
    FLAP_DECAY_S,
    MAX_REJOIN_S,
    REJOIN_S,
    Flapping,
    rejoin_s,
)
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.records import Plan, RunSpec
from tests.control.test_view import ME, A, B, C, make_view, record

SICK = {"links": {}, "health": {"ok": False, "reason": "the worker is silent for 61 s"}}
WELL = {"links": {}, "health": {"ok": True, "reason": ""}}


def changes(sets: list[list[str]]) -> int:
    """How many times a sequence of plannable sets changed."""
    return sum(1 for before, after in itertools.pairwise(sets) if before != after)


def test_the_back_off_doubles_with_recent_leaves_up_to_a_cap() -> None:
    assert rejoin_s(1) == 0.0  # the first return counts at once
    assert [rejoin_s(n) for n in (2, 3, 4)] == [REJOIN_S, 2 * REJOIN_S, 4 * REJOIN_S]
    assert rejoin_s(100) == MAX_REJOIN_S < FLAP_DECAY_S


def test_a_join_and_a_first_return_count_at_once_a_second_after_its_back_off() -> None:
    damper, known = Flapping(ME), {A, B}
    assert damper.admit([A, ME], 0.0, known) == [A, ME]
    assert damper.admit([A, B, ME], 1.0, known) == [A, B, ME]  # B joins: at once
    assert damper.admit([A, ME], 2.0, known) == [A, ME]  # B leaves: at once
    assert damper.admit([A, B, ME], 3.0, known) == [A, B, ME]  # back once: at once
    assert damper.admit([A, ME], 4.0, known) == [A, ME]
    assert damper.admit([A, B, ME], 5.0, known) == [A, ME]  # back again: it waits
    assert damper.admit([A, B, ME], 5.0 + REJOIN_S - 0.1, known) == [A, ME]
    assert damper.admit([A, B, ME], 5.0 + REJOIN_S, known) == [A, B, ME]


def test_a_member_the_plan_names_is_never_held_back() -> None:
    """A placed member that misses its liveness window for a second, a second time: back within
    the debounce it must change no plan (held back 15 s, it cost two re-plans)."""
    damper, known = Flapping(ME), {A, B}
    plan = Plan(1, 1, ME, 1, ((ME,), (B,)), (A,), {}, 1.0)
    damper.admit([A, B, ME], 0.0, known, plan)
    for t in (10.0, 20.0, 30.0):
        assert damper.admit([A, ME], t, known, plan) == [A, ME]  # gone: at once
        assert damper.admit([A, B, ME], t + 1, known, plan) == [A, B, ME]  # named: back at once
    assert damper.admit([A, B, ME], 32.0, known) == [A, ME]  # a plan without it: the back-off


def test_a_member_back_after_a_long_absence_counts_at_once() -> None:
    damper, known = Flapping(ME), {A}
    damper.admit([A, ME], 0.0, known)
    for t in (1.0, 3.0, 5.0):  # three leaves in a few seconds
        damper.admit([ME], t, known)
        damper.admit([A, ME], t + 1, known)
    assert damper.admit([ME], 10.0, known) == [ME]
    later = 10.0 + 4 * FLAP_DECAY_S  # gone for 40 min: its leaves are forgotten
    assert damper.admit([A, ME], later, known) == [A, ME]
    assert damper.flaps == {}  # nothing kept of it any more


def test_our_own_node_is_never_damped() -> None:
    damper = Flapping(ME)
    for t in range(10):
        assert damper.admit([A, ME] if t % 2 else [A], float(t), {A}) == ([A, ME] if t % 2 else [A])
    assert ME not in damper.flaps


def test_what_is_kept_of_a_peer_goes_when_it_stops_being_a_member() -> None:
    damper = Flapping(ME)
    damper.admit([A, B], 0.0, {A, B})
    damper.admit([A], 1.0, {A, B})
    assert set(damper.flaps) == {B}
    damper.admit([A], 2.0, {A})  # B forgotten by the view
    assert damper.flaps == {}


def test_a_member_flipping_its_health_no_longer_changes_the_plannable_set_each_flip() -> None:
    """The review's attack: Health(ok) true/false every 4 s (inside the telemetry rate limit);
    each change of the set was a new plan, each plan restarted every session."""
    v, feed = make_view(me=A, peers=(B, C))
    sets, t = [], 0.0
    for flip in range(150):  # 10 minutes of flips
        t = 4.0 * flip
        for peer in (B, C):
            body = (SICK if flip % 2 else WELL) if peer == C else WELL
            assert v.accept(feed("telemetry", peer, body), t) is None
        sets.append(plannable_members(v, t))
    # out, back once (at once), out: then it never stays well for its back-off (was 149)
    assert changes(sets) == 3
    assert all(s[:2] == [A, B] for s in sets)  # the honest members never moved


def test_a_flapper_that_waits_out_each_back_off_changes_the_set_rarely() -> None:
    """The best a flapper can do: leave as soon as it counts again, come back at once."""
    damper, known = Flapping(ME), {A, B}
    state, since, before, changed = "in", 0.0, [A, B], []
    for second in range(3600):
        t = float(second)
        now = damper.admit([A] if state == "out" else [A, B], t, known)
        if now != before:
            changed.append(t)
        before = now
        if state == "in" and B in now and t - since >= 5:
            state, since = "out", t
        elif state == "out":
            state, since = "back", t
        elif state == "back" and B in now:
            state, since = "in", t
    assert len(changed) <= 30  # an hour: two changes a cycle (was 1,200 and more)
    late = [t for t in changed if t > FLAP_DECAY_S]
    assert all(b - a >= MAX_REJOIN_S for a, b in zip(late[::2], late[2::2], strict=False))


def test_a_member_going_silent_or_toggling_its_role_is_damped_alike() -> None:
    v, feed = make_view(me=A, peers=(B, C))
    v.run = RunSpec().replace(stages=1, n_layer=2, min_peers=1)
    assert v.accept(feed("peer", B, record("trainer")), 0.0) is None
    assert v.accept(feed("peer", C, record("trainer")), 0.0) is None
    v.role = "trainer"
    sets = []
    for i in range(40):  # C speaks 2 s, then is silent past DEAD_AFTER_S, again and again
        t = 12.0 * i
        for peer in (B, C):
            assert v.accept(feed("telemetry", peer, WELL), t) is None
        sets.append(plannable_members(v, t))
        assert v.accept(feed("telemetry", B, WELL), t + 10.0) is None
        sets.append(plannable_members(v, t + 10.0))  # C silent 10 s: dead
    assert changes(sets) == 3  # out, back once, out (was 79)
    # its role: trainer, control-only, trainer, ... (a control-only member is not planned
    # beside trainers)
    v, feed = make_view(me=A, peers=(B, C))
    v.role = "trainer"
    sets = []
    for i in range(40):
        t = 4.0 * i
        role = "trainer" if i % 2 == 0 else "control-only"
        assert v.accept(feed("peer", B, record("trainer")), t) is None
        assert v.accept(feed("peer", C, record(role)), t) is None
        sets.append(plannable_members(v, t))
    assert changes(sets) == 3  # was 39


def test_the_planner_stops_re_planning_for_a_flapping_member() -> None:
    """End to end on the planner: a member that keeps flipping its health is planned around
    until it stays healthy for its back-off (a single return is re-planned at once, as
    test_health.py's planner test shows)."""
    v, feed = make_view(me=A, peers=(B, C))
    v.run = RunSpec().replace(stages=1, n_layer=2, min_peers=1, compute_aware=False)
    v.claim()
    maker = PlanMaker(v, A)
    made: list[tuple[float, bool]] = []  # when, and whether the plan places C

    async def main() -> None:
        for tick in range(2 * 720):
            t = tick / 2
            flipping = t < 180.0 and int(t // 4.0) % 2 == 1
            assert v.accept(feed("telemetry", B, WELL), t) is None
            assert v.accept(feed("telemetry", C, SICK if flipping else WELL), t) is None
            if await maker.tick(t, []):
                assert v.plan is not None
                made.append((t, C in v.plan.peers()))

    trio.run(main)
    # the first plan, C out, C back once, C out: then none in 165 s of flips (was one a 4 s)
    assert [placed for _, placed in made[:4]] == [True, False, True, False]
    assert made[3][0] < 15.0
    # C well for good from 176 s: planned again once it stayed well for the longest back-off
    assert len(made) == 5 and made[4][1]
    assert made[4][0] == 176.0 + MAX_REJOIN_S + PLAN_DEBOUNCE_S
