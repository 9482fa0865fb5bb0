"""The control tasks wake on changes, not on a timer: election, planning, publishing and the
worker link on trio's MockClock (autojump), so every wait is exact and instant."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import trio
import trio.testing

from p2ptrain.control import wire
from p2ptrain.control.candidacy import ELECTION_GRACE_S
from p2ptrain.control.election import CLAIM_SETTLE_S, serve_election
from p2ptrain.control.events import Changes
from p2ptrain.control.health import LEAVING
from p2ptrain.control.intake import Intake
from p2ptrain.control.membership import UNCHANGED_RECORD_S
from p2ptrain.control.planning import search_process
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S
from p2ptrain.control.publishing import (
    PUBLISH_GAP_S,
    RECORD_INTERVAL_S,
    RUN_INTERVAL_S,
    STEADY_AFTER_S,
    STEADY_RUN_INTERVAL_S,
    Publisher,
)
from p2ptrain.control.state import MIN_REPUBLISH_GAP_S, NodeState
from p2ptrain.control.view import DEAD_AFTER_S, SwarmView
from p2ptrain.control.worker_link import WorkerLink
from p2ptrain.records import Message, PlanMessage, RunSpec
from tests.control.test_view import A, B, C, Feed, make_view, plan, record

RUN = RunSpec().replace(stages=1, n_layer=2, min_peers=2, placement="random")  # a quick search
EXACT = 0.01  # a wake-up is this close to its cause (the deadlines' own margin is 1 ms)
SEED = bytes(range(1, 33))


def on_mock_clock(scenario: Callable[[], Awaitable[None]]) -> None:
    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))


def node(me: str, peers: tuple[str, ...]) -> tuple[NodeState, Intake, Feed]:
    """A joined node on trio's clock (started now), knowing `peers`, in RUN."""
    view, feed = make_view(me=me, peers=peers, now=trio.current_time())
    view.run = RUN
    state = NodeState(
        seed=SEED,
        role="control-only",
        peer_id=me,
        host=cast(Any, None),
        view=view,
        hardware={},
        clock=trio.current_time,
    )
    state.joined.set()
    return state, Intake(state), feed


def hear(intake: Intake, feed: Feed, peer: str) -> None:
    """`peer` re-announces its record (proof of life), through intake as gossip would."""
    env = feed("peer", peer, record())
    assert intake.apply(env, b"", peer, "gossip", trio.current_time())


async def watch_plans(
    view: SwarmView, changes: Changes, seen: list[tuple[float, set[str]]]
) -> None:
    count = changes.count("plan")
    while True:
        count = await changes.wait(("plan",), count)
        if view.plan is not None:
            seen.append((trio.current_time(), set(view.plan.peers())))


@pytest.fixture
def search_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler in this process: no child process whose run time moves the mock clock."""

    async def call(kind: str, *args: Any) -> Any:
        return search_process._work()[kind](*args)

    monkeypatch.setattr(search_process, "_call", call)


def test_changes_wake_their_waiters_and_none_is_missed() -> None:
    async def scenario() -> None:
        changes = Changes()
        seen = changes.count("plan")
        changes.notify("plan")  # before the wait: still seen
        assert await changes.wait(("plan",), seen) == seen + 1
        start = trio.current_time()
        assert await changes.wait(("plan",), seen + 1, timeout_s=3.0) == seen + 1
        assert trio.current_time() - start == pytest.approx(3.0)  # nothing came: timed out
        async with trio.open_nursery() as nursery:
            nursery.start_soon(changes.wait, ("run",), 0)
            await trio.sleep(1.0)
            changes.notify("members")  # not what it waits for
            await trio.sleep(1.0)
            changes.notify("run")
        assert trio.current_time() - start == pytest.approx(5.0)

    on_mock_clock(scenario)


@pytest.mark.usefixtures("search_in_process")
def test_the_planner_plans_a_join_and_a_death_one_debounce_after_it_knows() -> None:
    """Claim when the grace ends, first plan once the claim stood CLAIM_SETTLE_S, a join, a
    death: each plan comes PLAN_DEBOUNCE_S after the change is known (a record arrives;
    DEAD_AFTER_S of silence), to the millisecond."""

    async def scenario() -> None:
        state, intake, feed = node(A, (B,))
        plans: list[tuple[float, set[str]]] = []
        silent: set[str] = set()

        async def peers_speak() -> None:
            while True:
                for peer in [p for p in state.view.members if p not in silent]:
                    hear(intake, feed, peer)
                await trio.sleep(2.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_election, state)
            nursery.start_soon(peers_speak)
            nursery.start_soon(watch_plans, state.view, state.changes, plans)
            await trio.sleep(14.3)
            hear(intake, feed, C)  # C joins
            await trio.sleep(3.0)
            silent.add(C)  # C dies: last heard at 16.0 (peers_speak)
            await trio.sleep(20.0)
            nursery.cancel_scope.cancel()
        assert state.view.planner == A
        first = ELECTION_GRACE_S + CLAIM_SETTLE_S + PLAN_DEBOUNCE_S
        death = 16.0 + DEAD_AFTER_S + PLAN_DEBOUNCE_S
        expected = [(first, {A, B}), (14.3 + PLAN_DEBOUNCE_S, {A, B, C}), (death, {A, B})]
        assert [peers for _, peers in plans] == [peers for _, peers in expected]
        for (at, _), (want, _) in zip(plans, expected, strict=True):
            assert want <= at < want + EXACT

    on_mock_clock(scenario)


def test_a_candidate_that_loses_the_start_up_race_never_loads_the_planner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every candidate claims when its grace ends; one whose claim a rival's beats within
    CLAIM_SETTLE_S never makes a PlanMaker (numpy and the estimate: ~20 MB for good)."""
    from p2ptrain.control import election

    made: list[float] = []
    real = election._plan_maker

    def counted(state: NodeState) -> Any:
        made.append(trio.current_time())
        return real(state)

    monkeypatch.setattr(election, "_plan_maker", counted)

    async def scenario() -> None:
        state, intake, feed = node(A, (B,))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_election, state)
            await trio.sleep(ELECTION_GRACE_S + 1.0)
            assert state.view.planner == A and not made  # claimed, still settling
            env = feed("claim", B, {"term": state.view.term + 1})
            assert intake.apply(env, b"", B, "gossip", trio.current_time())
            hear(intake, feed, B)
            await trio.sleep(CLAIM_SETTLE_S + 1.0)  # past our claim's settling, B alive
            nursery.cancel_scope.cancel()
        assert state.view.planner == B
        assert not made

    on_mock_clock(scenario)


@pytest.mark.usefixtures("search_in_process")
def test_a_member_back_within_the_debounce_is_no_change() -> None:
    """B dies and speaks again 0.5 s later: no plan (the debounce absorbs the flap); a join
    after that still waits its full debounce."""

    async def scenario() -> None:
        state, intake, feed = node(A, (B,))
        plans: list[tuple[float, set[str]]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_election, state)
            nursery.start_soon(watch_plans, state.view, state.changes, plans)
            hear(intake, feed, B)
            await trio.sleep(7.0)
            hear(intake, feed, B)
            await trio.sleep(5.0)  # first plan at ~11.5
            assert len(plans) == 1
            await trio.sleep(DEAD_AFTER_S + 0.5 - 5.0)  # B dead since 15.0
            hear(intake, feed, B)
            await trio.sleep(5.0)
            assert len(plans) == 1
            joined_at = trio.current_time()
            hear(intake, feed, C)
            hear(intake, feed, B)
            await trio.sleep(PLAN_DEBOUNCE_S + 0.5)
            nursery.cancel_scope.cancel()
        assert len(plans) == 2 and plans[1][1] == {A, B, C}
        assert joined_at + PLAN_DEBOUNCE_S <= plans[1][0] < joined_at + PLAN_DEBOUNCE_S + EXACT

    on_mock_clock(scenario)


class FakeIpc:
    def __init__(self) -> None:
        self.sent: list[tuple[float, Message]] = []

    async def send(self, message: Message) -> None:
        self.sent.append((trio.current_time(), message))


def test_the_worker_link_hands_an_accepted_plan_over_at_once() -> None:
    async def scenario() -> None:
        state, intake, feed = node(A, (B,))
        link = WorkerLink(state, "/nonexistent/ipc.sock", print_progress=False)
        ipc = FakeIpc()
        link.ipc = cast(Any, ipc)
        assert intake.apply(feed("claim", B, {"term": 1}), b"", B, "gossip", 0.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link._serve_plans)
            await trio.sleep(3.3)
            env = feed("plan", B, plan(B, 1, 1))
            assert intake.apply(env, b"", B, "gossip", trio.current_time())
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        times = [at for at, message in ipc.sent if isinstance(message, PlanMessage)]
        assert times == [pytest.approx(3.3)]
        assert isinstance(ipc.sent[-1][1], PlanMessage) and ipc.sent[-1][1].plan.key == (1, 1)

    on_mock_clock(scenario)


class FakePubsub:
    def __init__(self) -> None:
        self.sent: list[tuple[float, str]] = []

    async def publish(self, topic: str, data: bytes) -> None:
        self.sent.append((trio.current_time(), wire.decode(data).kind))


def test_publish_soon_wakes_the_publisher_and_keeps_the_floor() -> None:
    async def scenario() -> None:
        state, _, _ = node(A, (B,))
        pubsub = FakePubsub()
        publisher = Publisher(state, cast(Any, pubsub))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher.serve_publishing)
            await trio.sleep(3.3)
            state.data_addrs = ["/ip4/127.0.0.1/tcp/5001"]  # our worker's addresses arrived
            state.publish_soon("record")
            await trio.sleep(0.2)
            state.data_addrs = ["/ip4/127.0.0.1/tcp/5002"]  # again: the 1 s floor holds it back
            state.publish_soon("record")
            await trio.sleep(2.0)
            await publisher.announce_leaving()
            nursery.cancel_scope.cancel()
        records = [at for at, kind in pubsub.sent if kind == "peer"]
        assert records[:3] == pytest.approx([0.0, 3.3, 3.3 + MIN_REPUBLISH_GAP_S], abs=0.05)
        telemetry = [at for at, kind in pubsub.sent if kind == "telemetry"]
        gaps = [b - a for a, b in itertools.pairwise(telemetry)]
        assert min(gaps) >= MIN_REPUBLISH_GAP_S - 1e-9  # the leaving notice too
        assert state.view.own_health == state.worker.last_word == LEAVING

    on_mock_clock(scenario)


def test_an_unchanged_member_record_waits_and_a_changed_one_goes_at_once() -> None:
    """A member's telemetry proves it alive: its record, unchanged, goes out every
    UNCHANGED_RECORD_S, not every RECORD_INTERVAL_S; a changed one at the next tick. A
    bootstrap (no member, no telemetry) keeps RECORD_INTERVAL_S: its record is its proof of
    life."""

    async def records(role: str, change_at: float | None) -> list[float]:
        state, _, _ = node(A, (B,))
        state.role = role
        pubsub, started = FakePubsub(), trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Publisher(state, cast(Any, pubsub)).serve_publishing)
            if change_at is not None:
                await trio.sleep(change_at)
                state.data_addrs = ["/ip4/127.0.0.1/tcp/5001"]  # not announced: the tick finds it
            await trio.sleep(3 * UNCHANGED_RECORD_S + 10.0 - (change_at or 0.0))
            nursery.cancel_scope.cancel()
        return [at - started for at, kind in pubsub.sent if kind == "peer"]

    # a record due while the loop publishes its other messages (the run spec, each followed by
    # PUBLISH_GAP_S) goes out right after them: at the interval's 1.1 jitter, a gap or two late
    late_s = 3 * PUBLISH_GAP_S

    async def scenario() -> None:
        unchanged = await records("control-only", None)
        gaps = [b - a for a, b in itertools.pairwise(unchanged)]
        assert len(unchanged) >= 3 and min(gaps) >= UNCHANGED_RECORD_S
        assert max(gaps) <= UNCHANGED_RECORD_S + 1.1 * RECORD_INTERVAL_S + late_s
        changed = await records("control-only", 8.0)
        assert any(8.0 < at <= 8.0 + 1.1 * RECORD_INTERVAL_S + late_s for at in changed)
        bootstrap = await records("bootstrap", None)
        gaps = [b - a for a, b in itertools.pairwise(bootstrap)]
        assert max(gaps) <= 1.1 * RECORD_INTERVAL_S + late_s

    on_mock_clock(scenario)


def test_the_organisers_record_and_run_slow_down_once_the_plan_stood() -> None:
    """A bootstrap's record (its proof of life) and run spec go out every RECORD_INTERVAL_S /
    RUN_INTERVAL_S until a plan stood STEADY_AFTER_S, then every STEADY_RUN_INTERVAL_S (each
    is a flood every node relays); the others then allow it NON_MEMBER_DEAD_AFTER_S."""
    from p2ptrain.control.membership import NON_MEMBER_DEAD_AFTER_S

    async def scenario() -> None:
        state, intake, feed = node(A, (B,))
        state.role = "bootstrap"
        pubsub = FakePubsub()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Publisher(state, cast(Any, pubsub)).serve_publishing)
            await trio.sleep(20.0)
            hear(intake, feed, B)
            assert intake.apply(feed("claim", B, {"term": 1}), b"", B, "gossip", 20.0)
            assert intake.apply(feed("plan", B, plan(B, 1, 1)), b"", B, "gossip", 20.0)
            assert state.view.plan is not None
            await trio.sleep(260.0)
            nursery.cancel_scope.cancel()
        steady_from = 20.0 + STEADY_AFTER_S + RUN_INTERVAL_S
        for kind, early_s in (("peer", RECORD_INTERVAL_S), ("run", RUN_INTERVAL_S)):
            sent = [at for at, k in pubsub.sent if k == kind]
            early = [b - a for a, b in itertools.pairwise(sent) if b <= 20.0]
            late = [b - a for a, b in itertools.pairwise(sent) if a >= steady_from]
            assert early and max(early) <= 1.1 * early_s, (kind, sent)
            assert len(late) >= 4 and min(late) >= STEADY_RUN_INTERVAL_S - 1e-6, (kind, sent)
            assert max(late) <= STEADY_RUN_INTERVAL_S + 1.1 * early_s, (kind, sent)

    on_mock_clock(scenario)

    view, feed = make_view(me=A, peers=(B,))
    assert view.accept(feed("peer", C, record("bootstrap")), 0.0) is None
    assert view.is_alive(C, NON_MEMBER_DEAD_AFTER_S - 1.0)
    assert not view.is_alive(C, NON_MEMBER_DEAD_AFTER_S + 1.0)
