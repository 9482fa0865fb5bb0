"""Sync and plan pulls answer strangers too, capped in streams held at once, not in requests:
a repeated `{"cursor": 0}` made a node decode and sort every envelope it held and sign its own
messages afresh (a planner's whole plan, up to 1 MiB), and each plan request re-signed the plan
or rebuilt its delta. What a request costs to build is now reused for a second
(control/recent.py), as the status document's pages are."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import trio

from p2ptrain.control import authored, plan_delta, sync, wire
from p2ptrain.control.held import HeldEnvelopes, Key
from p2ptrain.control.plan_pull import PlanPull
from p2ptrain.control.recent import Recent
from p2ptrain.records import Plan
from tests.control.test_gossip_screen import Author, make_node, validate
from tests.control.test_plan_pull import Planner, consecutive_plans, node_following
from tests.control.test_sync_digest import client_node


class CountedHeld(HeldEnvelopes):
    """Held envelopes that count how often one is read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __getitem__(self, key: Key) -> bytes:
        self.reads += 1
        return super().__getitem__(key)


def counted(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[object]:
    """Count the calls of owner.`name` (a module's function)."""
    calls: list[object] = []
    real = getattr(owner, name)

    def call(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(owner, name, call)
    return calls


def test_a_repeated_request_for_everything_is_built_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, intake = make_node(joined=True)
    state.latest = held = CountedHeld()
    authors = [Author() for _ in range(20)]
    for author in authors:
        assert validate(state, intake, author, author.record())
    signed = counted(monkeypatch, sync, "authored_messages")
    server = sync.PullSync(state, intake)
    held.reads = 0

    async def ask_ten_times() -> list[dict[str, Any]]:
        return [await server.respond_sync(b'{"cursor": 0}') for _ in range(10)]

    replies = trio.run(ask_ten_times)
    assert len(signed) == 1  # was 10
    assert held.reads == len(authors)  # was 10 x 20
    assert all(reply == replies[0] for reply in replies)
    assert len(replies[0]["envelopes"]) == 2 + len(authors)  # its record and telemetry too


def test_our_messages_are_signed_afresh_at_once_when_our_plan_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, intake = make_node(joined=True)
    signed = counted(monkeypatch, sync, "authored_messages")
    server = sync.PullSync(state, intake)
    trio.run(server.respond_sync, b"")
    trio.run(server.respond_sync, b"")
    state.view.plan_version += 1
    trio.run(server.respond_sync, b"")
    assert len(signed) == 2


def test_a_value_is_rebuilt_after_its_second_and_few_keys_are_kept() -> None:
    now = [0.0]
    built: Recent[str, tuple[str, float]] = Recent(lambda k: (k, now[0]), 2, clock=lambda: now[0])
    assert built.get("a") == built.get("a") == ("a", 0.0)
    now[0] = 0.9
    assert built.get("a") == ("a", 0.0) and built.get("b") == ("b", 0.9)
    now[0] = 1.0
    assert built.get("a") == ("a", 1.0) and built.get("b") == ("b", 0.9)
    built.get("c")  # "b", built first of the two kept, is dropped
    assert built.get("a") == ("a", 1.0) and built.num_built == 4
    assert built.get("b") == ("b", 1.0) and built.num_built == 5


def test_the_planner_signs_its_plan_once_a_second_for_any_number_of_askers() -> None:
    state, intake = client_node()
    state.view.term = 2
    me = Planner()
    me.seed, me.id = state.seed, state.peer_id
    body = wire.decode(me.plan(2, 1, others=900)).body
    assert isinstance(body, Plan)
    state.view.adopt_own_plan(body)
    signings: list[float] = []

    def own_plan() -> bytes:
        signings.append(time.time())
        return authored.plan_message(state)

    server = PlanPull(state, own_plan, intake.apply)

    async def ask_ten_times() -> list[dict[str, Any]]:
        request = json.dumps({"term": 2, "epoch": 1}).encode()
        return [await server.respond(request) for _ in range(10)]

    replies = trio.run(ask_ten_times)
    assert len(signings) == 1  # was 10: ~17 ms each for a 700 kB plan
    assert wire.decode(replies[-1]["envelope"].encode()).body == body


def test_a_delta_is_made_once_for_many_askers_holding_one_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner = Planner()
    first, second = consecutive_plans(planner)
    state, intake = node_following(planner)
    server = PlanPull(state, lambda: b"", intake.apply)
    for data in (first, second):
        assert intake.apply(wire.decode(data), data, planner.id, "sync", time.monotonic())
        trio.run(server.respond, json.dumps({"term": 1, "epoch": 1}).encode())  # a base
    made = counted(monkeypatch, plan_delta, "delta")

    async def ask_ten_times() -> list[dict[str, Any]]:
        request = json.dumps({"term": 1, "epoch": 2, "have": [1, 1]}).encode()
        return [await server.respond(request) for _ in range(10)]

    replies = trio.run(ask_ten_times)
    assert len(made) == 1  # was 10
    rebuilt = plan_delta.rebuild(json.loads(first)["body"], replies[-1]["delta"])
    assert rebuilt == second


def test_a_node_that_has_not_joined_serves_only_what_it_holds() -> None:
    """Before joining, what we would sign states a node the swarm does not know yet (its
    telemetry and record went out to any stranger who asked); once joined, both are served."""
    state, intake = make_node()
    author = Author()
    assert validate(state, intake, author, author.record())
    server = sync.PullSync(state, intake)

    def served_authors() -> list[str]:
        page = trio.run(server.respond_sync, b"")
        return [wire.decode(str(text).encode()).author for text in page["envelopes"]]

    assert served_authors() == [author.id]
    state.joined.set()
    state.view.plan_version += 1  # a new key: not the reply built a moment ago
    assert served_authors().count(state.peer_id) == 2
