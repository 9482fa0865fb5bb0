"""Issue 29: a plan too large to gossip whole (control/plan_pull.py). The planner's claim names
its key; a node lacking it pulls it from the peer that sent the claim, retrying while that peer
is still pulling it itself, then from the planner; the pulled envelope passes the same checks as
a gossiped one, and gossip refuses one over its 64 KiB envelope."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
import trio

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.authored import INLINE_PLAN_BYTES, claim_message, own_plan_bytes
from p2ptrain.control.gossip import CONTROL_TOPIC
from p2ptrain.control.intake import Intake
from p2ptrain.control.plan_pull import NOT_YET, PlanPull
from p2ptrain.control.planner_sight import pool_size
from p2ptrain.control.state import NodeState
from p2ptrain.records import Claim, Plan, issue_token
from tests.control.test_gossip_screen import ORGANISER, RUN_ID, Author, validate
from tests.control.test_sync_digest import client_node


class Planner(Author):
    def __init__(self) -> None:
        super().__init__()
        self.token = issue_token(ORGANISER, self.id, True, time.time() + 3600, RUN_ID)

    def plan(self, term: int, epoch: int, others: int = 0) -> bytes:
        """A plan of ours alone; `others`: data addresses of that many more peers (its size)."""
        addrs = {self.id: ["/ip4/127.0.0.1/tcp/4001"]}
        for _ in range(others):
            addrs[identity.peer_id_of(os.urandom(32))] = ["/ip4/198.51.100.7/tcp/40001"]
        body = {
            "term": term,
            "epoch": epoch,
            "planner": self.id,
            "stages": 1,
            "pipelines": [[self.id]],
            "spares": [],
            "data_addrs": addrs,
            "cost_s": 1.0,
        }
        return wire.sign(self.seed, "plan", self.seq.next(), body, run_id=RUN_ID)


def node_following(planner: Planner, term: int = 1) -> tuple[NodeState, Intake]:
    """A node that holds the planner's record and its claim of `term`, no plan."""
    state, intake = client_node()
    assert validate(state, intake, planner, planner.record())
    assert validate(state, intake, planner, planner.message("claim", {"term": term}))
    assert state.view.planner == planner.id
    return state, intake


def gossiped(planner: Planner, data: bytes) -> Any:
    message = planner.record()
    message.data = data
    message.topicIDs[:] = [CONTROL_TOPIC]
    return message


def pulls(nodes: dict[str, tuple[NodeState, Intake]], own: bytes = b"") -> dict[str, PlanPull]:
    return {
        peer: PlanPull(state, lambda: own, intake.apply) for peer, (state, intake) in nodes.items()
    }


def test_a_claim_naming_a_plan_we_lack_pulls_it_from_its_sender_retrying_while_it_pulls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner = Planner()
    plan = planner.plan(1, 1, others=900)  # over gossip's envelope
    assert len(plan) > wire.MAX_ENVELOPE_BYTES
    relay, asker = node_following(planner), node_following(planner)
    peers = pulls({relay[0].peer_id: relay, asker[0].peer_id: asker})
    asked: list[str] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        asked.append(peer.to_base58())
        if len(asked) == 2:  # the relay got it meanwhile (from its own sender)
            env = wire.decode(plan)
            relay[1].apply(env, plan, planner.id, "sync", time.monotonic())
        return await peers[peer.to_base58()].respond(request)

    monkeypatch.setattr("p2ptrain.control.plan_pull.rpc.call", call)
    puller = peers[asker[0].peer_id]
    # the claim arrives (from the relay) naming plan (1, 1): queued, pulled by serve()
    assert validate(asker[0], asker[1], planner, planner.message("claim", {"term": 1}))
    puller.want((1, 1), relay[0].peer_id)
    puller.want((1, 1), relay[0].peer_id)  # a second copy of the claim: one pull

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(puller.serve)
            with trio.fail_after(10):
                while asker[0].view.plan is None:  # noqa: ASYNC110 (the view has no event)
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(run)
    assert asker[0].view.plan is not None and asker[0].view.plan.key == (1, 1)
    assert asked == [relay[0].peer_id] * 2  # "not yet", then the plan: never the planner
    assert asker[0].latest[(planner.id, "plan")] == plan  # and serves it on in turn


def test_a_sender_that_cannot_serve_it_sends_us_to_the_planner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner = Planner()
    plan = planner.plan(1, 1)
    asker = node_following(planner)
    puller = PlanPull(asker[0], lambda: b"", asker[1].apply)
    asked: list[str] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        asked.append(peer.to_base58())
        if peer.to_base58() == planner.id:
            return {"envelope": plan.decode()}
        return {"error": "no such protocol"}

    monkeypatch.setattr("p2ptrain.control.plan_pull.rpc.call", call)
    trio.run(puller._pull, (1, 1), "12D3KooWGzh7AaB1RcaR3aD7ZRKvk8YpbhUnHEeuEYZiGKmMYDy4")
    assert asker[0].view.plan is not None and asker[0].view.plan.key == (1, 1)
    assert asked[-1] == planner.id and len(asked) == 2


def test_the_server_answers_not_yet_until_it_holds_the_plan_and_refuses_garbage() -> None:
    planner = Planner()
    node = node_following(planner)
    server = PlanPull(node[0], lambda: b"", node[1].apply)

    def ask(request: object) -> dict[str, Any]:
        return trio.run(server.respond, json.dumps(request).encode())

    assert ask({"term": 1, "epoch": 1}) == {"error": NOT_YET}
    plan = planner.plan(1, 1)
    assert validate(node[0], node[1], planner, gossiped(planner, plan))
    assert ask({"term": 1, "epoch": 1}) == {"envelope": plan.decode()}
    assert ask({"term": 1, "epoch": 2}) == {"error": NOT_YET}
    for bad in ({"term": 0, "epoch": 1}, {"term": "x"}, [1, 2], {}):
        assert set(ask(bad)) == {"error"}


def test_gossip_refuses_a_plan_over_its_envelope_a_pull_takes_it() -> None:
    planner = Planner()
    node = node_following(planner)
    large = planner.plan(1, 1, others=900)
    assert not validate(node[0], node[1], planner, gossiped(planner, large))
    assert node[0].view.plan is None
    assert wire.decode(large).kind == "plan"  # what a pull decodes
    with pytest.raises(wire.WireError, match="oversized"):
        wire.decode(wire.sign(planner.seed, "claim", 9, {"term": 1, "x": "0" * 70_000}))


def test_the_planners_claim_names_its_plan_only_when_it_is_too_large_to_gossip() -> None:
    state, _ = client_node()
    state.view.term = 2

    def own_plan(others: int) -> None:
        me = Planner()
        me.seed, me.id = state.seed, state.peer_id
        body = wire.decode(me.plan(2, state.view.plan_version + 1, others)).body
        assert isinstance(body, Plan)
        state.view.adopt_own_plan(body)

    def claimed() -> Claim:
        body = wire.decode(claim_message(state)).body
        assert isinstance(body, Claim)
        return body

    sees = pool_size(state.view, state.clock())  # how many peers we could plan for
    own_plan(0)
    assert own_plan_bytes(state) < INLINE_PLAN_BYTES and claimed() == Claim(2, sees=sees)
    own_plan(900)
    assert own_plan_bytes(state) > INLINE_PLAN_BYTES
    assert claimed() == Claim(2, state.view.plan.key if state.view.plan else None, sees)


def test_a_key_nobody_serves_does_not_stop_later_claims_from_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token holder's claim may name any key: once its pull gave up, a later claim asks again."""
    planner = Planner()
    node = node_following(planner)
    puller = PlanPull(node[0], lambda: b"", node[1].apply)
    asked: list[str] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        asked.append(peer.to_base58())
        return {"error": "no such plan here"}

    monkeypatch.setattr("p2ptrain.control.plan_pull.rpc.call", call)
    monkeypatch.setattr("p2ptrain.control.plan_pull.PULL_RETRY_S", 0.01)
    sender = identity.peer_id_of(os.urandom(32))

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(puller.serve)
            for _ in range(2):
                before = len(asked)
                puller.want((7, 7), sender)
                with trio.fail_after(5):
                    while len(asked) < before + 2 or puller._asked != (0, 0):  # noqa: ASYNC110
                        await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(run)
    assert asked == [sender, planner.id] * 2  # the sender, then the planner, each time


def test_a_pulled_plan_over_the_gossip_envelope_is_not_kept_in_the_header_cache() -> None:
    planner = Planner()
    large = planner.plan(1, 1, others=900)
    hits = wire._VERIFIED.hits
    for _ in range(2):
        assert wire.decode(large).kind == "plan"
    assert wire._VERIFIED.hits == hits and large not in wire._VERIFIED._by_bytes


def consecutive_plans(planner: Planner) -> tuple[bytes, bytes]:
    """A 900-peer plan of term 1 and the re-plan after it (epoch 2): a delta's base and plan."""
    first = planner.plan(1, 1, others=900)
    next_body = {**json.loads(first)["body"], "epoch": 2, "cost_s": 0.5}
    return first, wire.sign(planner.seed, "plan", planner.seq.next(), next_body, run_id=RUN_ID)


def test_a_node_holding_the_last_plan_pulls_the_next_as_its_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner = Planner()
    first, second = consecutive_plans(planner)
    server, asker = node_following(planner), node_following(planner)
    for node in (server, asker):
        assert node[1].apply(wire.decode(first), first, planner.id, "sync", time.monotonic())
    serving = PlanPull(server[0], lambda: b"", server[1].apply)
    puller = PlanPull(asker[0], lambda: b"", asker[1].apply)
    assert trio.run(serving.respond, json.dumps({"term": 1, "epoch": 1}).encode())["envelope"]
    assert server[1].apply(wire.decode(second), second, planner.id, "sync", time.monotonic())
    replies: list[dict[str, Any]] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        replies.append(await serving.respond(request))
        return replies[-1]

    monkeypatch.setattr("p2ptrain.control.plan_pull.rpc.call", call)
    assert trio.run(puller._pull_from, server[0].peer_id, (1, 2)) is None
    assert asker[0].view.plan is not None and asker[0].view.plan.key == (1, 2)
    assert asker[0].latest[(planner.id, "plan")] == second  # the planner's exact bytes
    assert list(replies[0]) == ["delta"] and len(json.dumps(replies[0])) < len(first) / 4
