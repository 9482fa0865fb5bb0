"""Worker health (control/health.py, issue 11 attack 7): the rule, with a fake clock, and the
planner planning around an unhealthy member."""

from __future__ import annotations

import pytest
import trio

from p2ptrain.control.health import (
    LEAVING,
    LEFT,
    QUIT,
    STUCK_FACTOR,
    WorkerWatch,
    health_bound_s,
)
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.control.status import swarm_status
from p2ptrain.records import Health, Plan, RunSpec
from tests.control.test_view import ME, A, B, C, make_view, record

FLOOR_S = 60.0


def plan(pipelines: list[list[str]], cost_s: float = 0.5, epoch: int = 1) -> Plan:
    return Plan(
        term=1,
        epoch=epoch,
        planner=A,
        stages=len(pipelines[0]),
        pipelines=tuple(tuple(p) for p in pipelines),
        spares=(),
        data_addrs={},
        cost_s=cost_s,
    )


def test_the_bound_is_the_floor_or_ten_predicted_steps() -> None:
    assert health_bound_s(FLOOR_S, 0.5) == FLOOR_S
    assert health_bound_s(FLOOR_S, 30.0) == 300.0


def test_a_worker_that_never_spoke_is_unhealthy_after_the_bound() -> None:
    # a control-only node (no worker) in a plan, or a worker that never came up
    watch = WorkerWatch(started_at=0.0)
    placed = plan([[ME, B]])
    assert watch.judge(FLOOR_S - 1, placed, ME, FLOOR_S).ok  # a worker may still be starting
    health = watch.judge(FLOOR_S + 1, placed, ME, FLOOR_S)
    assert not health.ok and "no worker spoke" in health.reason
    assert not watch.judge(FLOOR_S + 1, None, ME, FLOOR_S).ok  # planned out: still unhealthy


@pytest.mark.parametrize("word", [LEFT, QUIT])
def test_a_node_that_exits_keeps_saying_so(word: Health) -> None:
    """Its last word (LEFT after a hand-over, QUIT without one) stays until it is gone: the
    health check's next tick once put LEAVING back, and a planner that heard that kept it as a
    donor, re-issuing its plan only when it went silent."""
    watch = WorkerWatch(started_at=0.0, last_word=LEAVING)
    assert watch.judge(1.0, None, ME, FLOOR_S) == LEAVING
    watch.last_word = word  # Publisher.announce_exit
    assert watch.judge(2.0, None, ME, FLOOR_S) == word
    assert word.leaving and (word.left, word.quits) == (word is LEFT, word is QUIT)


def test_a_frozen_worker_is_unhealthy_until_it_speaks_again() -> None:
    watch = WorkerWatch(started_at=0.0)
    placed = plan([[ME, B]])
    for t in range(0, 20, 2):  # heartbeats every 2 s, steps advancing
        watch.heard(float(t), (1, 1, "training", t))
        assert watch.judge(float(t), placed, ME, FLOOR_S).ok
    frozen_at = 18.0
    assert watch.judge(frozen_at + FLOOR_S - 1, placed, ME, FLOOR_S).ok
    health = watch.judge(frozen_at + FLOOR_S + 1, placed, ME, FLOOR_S)
    assert not health.ok and "silent" in health.reason
    planned_out = plan([[A, B]], epoch=2)
    assert not watch.judge(frozen_at + FLOOR_S + 5, planned_out, ME, FLOOR_S).ok  # sticky
    watch.heard(frozen_at + 100, (1, 1, "training", 18))  # SIGCONT: it speaks again
    assert watch.judge(frozen_at + 100, planned_out, ME, FLOOR_S).ok


def test_the_bound_grows_with_the_plans_predicted_step_time() -> None:
    watch = WorkerWatch(started_at=0.0)
    watch.heard(0.0, (1, 1, "training", 0))
    slow = plan([[ME, B]], cost_s=20.0)  # a WAN plan: 10 steps = 200 s
    assert watch.judge(150.0, slow, ME, FLOOR_S).ok
    assert not watch.judge(201.0, slow, ME, FLOOR_S).ok


def test_a_placed_worker_that_speaks_but_never_moves_is_stuck_after_a_longer_bound() -> None:
    watch = WorkerWatch(started_at=0.0)
    placed = plan([[ME, B]])
    stuck_s = STUCK_FACTOR * FLOOR_S
    for t in range(0, int(stuck_s) + 10, 2):  # alive, but always at step 5
        watch.heard(float(t), (1, 1, "training", 5))
        health = watch.judge(float(t), placed, ME, FLOOR_S)
        assert health.ok == (t <= stuck_s), t
    assert "no progress" in health.reason
    # a spare, or a peer the plan leaves out, has nothing to make progress on
    spare = plan([[A, B]], epoch=2)
    assert watch.judge(stuck_s + 12, spare, ME, FLOOR_S).ok
    # a neighbour of a frozen peer is stuck too, but the frozen one is judged (silent) first,
    # and a new plan restarts the clock
    again = plan([[ME, C]], epoch=3)
    watch.heard(stuck_s + 14, (1, 1, "training", 5))
    assert watch.judge(stuck_s + 14, again, ME, FLOOR_S).ok


def test_the_check_is_off_with_a_zero_floor() -> None:
    assert WorkerWatch(started_at=0.0).judge(1e6, plan([[ME]]), ME, 0.0).ok


def test_the_planner_plans_around_an_unhealthy_member_and_status_shows_it() -> None:
    v, feed = make_view(me=A, peers=(B, C))
    v.run = RunSpec().replace(
        stages=1, n_layer=2, min_peers=1, compute_aware=False
    )  # no workers to time
    for peer in (B, C):
        assert v.accept(feed("peer", peer, record()), 0.0) is None
    bad = {"ok": False, "reason": "the worker is silent for 61 s (bound 60 s)"}
    assert v.accept(feed("telemetry", C, {"links": {}, "health": bad}), 0.0) is None
    assert v.accept(feed("telemetry", B, {"links": {}}), 0.0) is None  # an older peer: ok
    assert plannable_members(v, 0.0) == [A, B] and v.live_members(0.0) == [A, B, C]
    v.claim()
    maker = PlanMaker(v, A)

    async def plan_twice() -> None:
        await maker.tick(1.0, [])  # a membership change: debounced
        assert await maker.tick(1.0 + PLAN_DEBOUNCE_S + 0.1, [])

    trio.run(plan_twice)
    assert v.plan is not None and C not in v.plan.peers() and v.plan.peers() == {A, B}
    peers = {p.id: p for p in swarm_status(v, 2.0).peers}
    assert peers[C].health is not None and not peers[C].health.ok
    assert "silent" in peers[C].health.reason
    # healthy again: planned again
    good = {"ok": True, "reason": ""}
    assert v.accept(feed("telemetry", C, {"links": {}, "health": good}), 3.0) is None

    async def replan() -> None:
        await maker.tick(3.0, [])
        assert await maker.tick(3.0 + PLAN_DEBOUNCE_S + 0.1, [])

    trio.run(replan)
    assert v.plan.peers() == {A, B, C}


def test_once_a_member_trains_a_control_only_member_is_never_placed() -> None:
    """A control-only member has no data-plane address: a re-plan placing it stalled every
    worker of the red-team run (docs/security.md, row 7). A swarm of control-only peers (the
    control plane's tests) still plans them all."""
    v, feed = make_view(me=A, peers=(B, C))
    for peer in (B, C):
        assert v.accept(feed("peer", peer, record()), 0.0) is None
    assert plannable_members(v, 0.0) == [A, B, C]  # nobody trains: everyone stands in
    trainer = {**record("trainer"), "data_addrs": ["/ip4/127.0.0.1/tcp/4001"]}
    assert v.accept(feed("peer", B, trainer), 0.0) is None
    assert plannable_members(v, 0.0) == [B]
