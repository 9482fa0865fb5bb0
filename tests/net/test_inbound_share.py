"""Issue 26, finding 15: strangers holding idle streams must not lock members out (live hosts)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.net import rpc
from p2ptrain.net.host import full_addrs, make_host
from tests.net.trio_run import run

HELLO = TProtocol("/test/hello/1.0.0")
LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


@asynccontextmanager
async def hosts_connected_to(server: IHost, count: int) -> AsyncIterator[list[IHost]]:
    """`count` fresh identities, each connected to `server`."""
    async with AsyncExitStack() as stack:
        hosts = [make_host(os.urandom(32)) for _ in range(count)]
        for host in hosts:
            await stack.enter_async_context(host.run(listen_addrs=LISTEN))
            await host.connect(info_from_p2p_addr(Multiaddr(full_addrs(server)[0])))
        yield hosts


async def hello(_: bytes) -> dict[str, Any]:
    return {"hello": True}


async def wait_for(predicate: Any) -> None:
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110 - the limiter's counters have no event
            await trio.sleep(0.05)


def test_strangers_holding_idle_streams_do_not_block_a_member() -> None:
    """Five strangers hold every stream the per-peer cap allows them, idle, past what the old
    single cap of 8 in all let anyone else open; a member's request still gets its answer, and
    the strangers past their quarter are refused."""
    members: set[str] = set()
    limits = rpc.InboundLimits(per_peer=2, total=8, is_member=members.__contains__)

    async def scenario() -> tuple[Any, int, int]:
        server = make_host(os.urandom(32))
        async with server.run(listen_addrs=LISTEN):
            server.set_stream_handler(HELLO, limits.guard(rpc.make_handler(hello)))
            async with (
                hosts_connected_to(server, 1) as (member,),
                hosts_connected_to(server, 5) as strangers,
            ):
                members.add(member.get_id().to_base58())
                idle: list[INetStream] = []
                for stranger in strangers:
                    for _ in range(2):
                        # a refused stream may fail while it is being opened
                        with contextlib.suppress(Exception):
                            idle.append(await stranger.new_stream(server.get_id(), [HELLO]))
                # every stranger stream has reached the limiter: held, or refused
                await wait_for(lambda: limits._num_strangers_open + limits.num_refused >= 10)
                held = limits._num_strangers_open
                reply = await rpc.call(member, server.get_id(), HELLO)
                return reply, held, limits.num_refused

    reply, held, refused = run(scenario)
    assert reply == {"hello": True}
    assert held == 2  # a quarter of the 8 streams, for all strangers together
    assert refused == 8


def test_a_stream_left_idle_is_reset_at_the_deadline() -> None:
    """An idle stream frees its slot after deadline_s, whatever its handler waits for."""
    limits = rpc.InboundLimits(per_peer=1, total=4, deadline_s=0.5)

    async def forever(stream: INetStream) -> None:
        await trio.sleep_forever()

    async def scenario() -> tuple[bytes | None, int]:
        server = make_host(os.urandom(32))
        async with server.run(listen_addrs=LISTEN):
            server.set_stream_handler(HELLO, limits.guard(forever))
            async with hosts_connected_to(server, 1) as (client,):
                stream = await client.new_stream(server.get_id(), [HELLO])
                await wait_for(lambda: limits._num_open == 1)
                await wait_for(lambda: limits._num_open == 0)
                got: bytes | None = b"open"
                with trio.move_on_after(5):
                    try:
                        got = await stream.read(1)
                    except Exception:
                        got = None  # reset by the server
                return got, limits.num_refused

    got, refused = run(scenario)
    assert got in (None, b"")  # the server ended the stream
    assert refused == 0
