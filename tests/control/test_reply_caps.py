"""RPC replies capped per protocol (net/rpc.cap_replies): a client refuses a reply over its
protocol's cap by the frame's length, before reading or parsing it (a 4 MiB reply of
`[[],[],...]` held the loop 0.38 s), the largest reply an honest server sends fits its cap, a
plan-pull source whose reply is no plan reply is blamed, and a sync round ends after
MAX_UNUSABLE_BYTES of envelopes it cannot use (a hostile partner's 1,024 heavy stale
envelopes cost ~8 s a round)."""

from __future__ import annotations

import json
import os
import struct
import time
from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol

from p2ptrain import identity
from p2ptrain.control import plan_pull, rpcs, sync, wire
from p2ptrain.control.plan_pull import PlanPull
from p2ptrain.errors import WireError
from p2ptrain.net import rpc
from p2ptrain.records.replies import PlanReply, RunReply, SyncPage, SyncRequest
from tests.control.test_gossip_screen import RUN_ID, Author
from tests.control.test_plan_pull import Planner, node_following
from tests.control.test_sync_digest import client_node, server_with
from tests.control.test_sync_round import HOSTILE, count_decodes, listing, serve
from tests.net.test_protocols import host_pair
from tests.net.trio_run import run

CAPPED = {
    plan_pull.PLAN_PROTOCOL: plan_pull.PLAN_REPLY_BYTES,
    rpcs.RUN_PROTOCOL: rpcs.RUN_REPLY_BYTES,
}


def reply_size(reply: dict[str, Any]) -> int:
    return len(json.dumps(reply, separators=(",", ":")).encode())  # as rpc.make_handler sends


def test_each_protocol_has_its_cap_and_status_pages_keep_theirs() -> None:
    for protocol, cap in CAPPED.items():
        assert rpc.reply_cap(protocol) == cap < rpc.MAX_REPLY_BYTES
    assert rpc.reply_cap(rpcs.STATUS_PROTOCOL) == rpc.MAX_REPLY_BYTES


@pytest.mark.parametrize("protocol", list(CAPPED))
def test_a_reply_over_its_protocols_cap_is_refused_unparsed(
    protocol: TProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[bytes] = []
    monkeypatch.setattr(rpc, "json_value", lambda data, what: parsed.append(data))
    body = b"[" + b"[]," * (CAPPED[protocol] // 3) + b"[]]"  # the audit's nested arrays

    async def hostile(stream: Any) -> None:
        await stream.read(4096)
        await stream.write(struct.pack(">I", len(body)) + body[:4096])  # announces it all
        await stream.close()

    async def scenario() -> str:
        async with host_pair() as (a, b):
            b.set_stream_handler(protocol, hostile)
            try:
                await rpc.call(a, b.get_id(), protocol, b"{}")
            except WireError as exc:
                return str(exc)
            return "read"

    assert run(scenario).startswith("oversized")
    assert parsed == []


def test_a_server_answers_an_error_rather_than_a_reply_over_its_cap() -> None:
    protocol = TProtocol("/test/capped/1.0.0")
    rpc.cap_replies(protocol, 1024)

    async def respond(request: bytes) -> dict[str, Any]:
        return {"echo": "x" * 2048}

    async def scenario() -> Any:
        async with host_pair() as (a, b):
            b.set_stream_handler(protocol, rpc.make_handler(respond))
            return await rpc.call(a, b.get_id(), protocol, b"hi")

    assert run(scenario) == {"error": "reply too large"}


def escaping_envelope(kind: str, max_bytes: int) -> bytes:
    """A canonical envelope of `kind` just under max_bytes whose body is all quotes: the most
    its JSON string grows (each quote, already `\\"`, escaped again)."""
    seed, quotes = os.urandom(32), max_bytes // 2 - 600
    data = wire.sign(seed, kind, 1, {"x": '"' * quotes}, run_id=RUN_ID)
    assert max_bytes - 1200 < len(data) <= max_bytes
    return data


def test_the_largest_honest_run_and_plan_replies_fit_their_caps() -> None:
    run_env = escaping_envelope("run", wire.MAX_ENVELOPE_BYTES).decode()
    assert reply_size(RunReply(envelope=run_env).to_dict()) <= rpcs.RUN_REPLY_BYTES
    # a non-ASCII one the organiser signed by hand: each 2-byte character becomes `\u00e9`
    wide = "\u00e9" * (wire.MAX_ENVELOPE_BYTES // 2)
    assert reply_size(RunReply(envelope=wide).to_dict()) <= rpcs.RUN_REPLY_BYTES
    plan_env = escaping_envelope("plan", wire.MAX_PLAN_ENVELOPE_BYTES).decode()
    assert reply_size(PlanReply(envelope=plan_env).to_dict()) <= plan_pull.PLAN_REPLY_BYTES


def test_the_largest_honest_sync_pages_fit_the_cap() -> None:
    """A server holding 300 records and the largest plan serves every page under the cap."""
    server, _ = server_with([Author() for _ in range(300)])
    plan = escaping_envelope("plan", wire.MAX_PLAN_ENVELOPE_BYTES)
    server.state.latest[(identity.peer_id_of(os.urandom(32)), "plan")] = plan
    cursor: int | None = 0
    served = 0
    while cursor is not None:
        request = json.dumps(SyncRequest(cursor).to_dict()).encode()
        reply = trio.run(server.respond_sync, request)
        assert reply_size(reply) <= rpc.MAX_REPLY_BYTES
        page = SyncPage.from_dict(reply)
        served += len(page.envelopes)
        cursor = page.next
    assert served >= 301


def test_a_plan_source_whose_reply_is_no_plan_reply_is_blamed_and_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner = Planner()
    plan = planner.plan(1, 1)
    state, intake = node_following(planner)
    puller = PlanPull(state, lambda: b"", intake.apply)
    source = identity.peer_id_of(os.urandom(32))
    asked: list[str] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        asked.append(peer.to_base58())
        if peer.to_base58() == planner.id:
            return {"envelope": plan.decode()}
        raise WireError("oversized: RPC reply: frame of 4194304 bytes exceeds 2101248")

    monkeypatch.setattr("p2ptrain.control.plan_pull.rpc.call", call)
    trio.run(puller._pull, (1, 1), source)
    assert state.view.plan is not None and state.view.plan.key == (1, 1)
    assert asked == [source, planner.id]  # not asked again: the planner next
    assert state.view.penalties.score(source) > 0
    assert state.view.penalties.score(planner.id) == 0


def heavy_stale_envelopes(count: int) -> list[str]:
    """Telemetry of throwaway authors, ~60 kB of nested arrays each, signed 100 s ago."""
    heavy = {"x": [[] for _ in range(20_000)]}
    return [
        wire.sign(os.urandom(32), "telemetry", 1, heavy, time.time() - 100, RUN_ID).decode()
        for _ in range(count)
    ]


def test_heavy_stale_envelopes_end_the_round_after_max_unusable_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, intake = client_node()
    envelopes = heavy_stale_envelopes(8)
    size = len(envelopes[0].encode())
    requests = serve(monkeypatch, listing(envelopes, forever=True))
    decoded = count_decodes(monkeypatch)
    trio.run(sync.PullSync(state, intake).sync_from, HOSTILE)
    assert len(decoded) == -(-sync.MAX_UNUSABLE_BYTES // size)  # was MAX_UNUSABLE (1,024)
    assert len(decoded) < sync.MAX_UNUSABLE
    assert len(requests) == -(-len(decoded) // len(envelopes))
    assert state.view.penalties.score(HOSTILE) == 0  # stale: never blamed
