"""A stream whose exchange failed or timed out is reset at once (net/stream_end.py). Its close
used to run in the already-cancelled scope and never happen: each timed-out call kept one of
the connection's 256 yamux stream slots for the connection's life, and after 256 of them no
new stream to that healthy peer could open."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.net import rpc
from p2ptrain.net.host import full_addrs, make_host
from tests.net.trio_run import run

SLOW, FAST = TProtocol("/test/slow/1.0.0"), TProtocol("/test/fast/1.0.0")
LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def test_timed_out_calls_give_their_stream_slots_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "RPC_TIMEOUT_S", 0.3)  # both ends' deadline (10 s)

    async def scenario() -> tuple[int, int, int, Any]:
        a, b = make_host(os.urandom(32)), make_host(os.urandom(32))
        async with a.run(listen_addrs=LISTEN), b.run(listen_addrs=LISTEN):
            await a.connect(info_from_p2p_addr(Multiaddr(full_addrs(b)[0])))

            async def slow(request: Any) -> dict[str, bool]:  # answers past the deadline
                await trio.sleep(0.5)
                return {"ok": True}

            async def fast(request: Any) -> dict[str, bool]:
                return {"ok": True}

            b.set_stream_handler(SLOW, rpc.make_handler(slow))
            b.set_stream_handler(FAST, rpc.make_handler(fast))
            muxed = a.get_network().get_connections(b.get_id())[0].muxed_conn
            free_at_start = muxed.stream_backlog_semaphore.value
            timed_out = 0

            async def one() -> None:
                nonlocal timed_out
                try:
                    await rpc.call(a, b.get_id(), SLOW)
                except trio.TooSlowError:
                    timed_out += 1

            async with trio.open_nursery() as nursery:
                for _ in range(24):
                    nursery.start_soon(one)
            # the late replies and the server's own ends arrive (on a loaded box, later); a
            # leaked slot never comes back
            for _ in range(200):  # 10 s: the semaphore has no event to wait on
                if muxed.stream_backlog_semaphore.value >= free_at_start:
                    break
                await trio.sleep(0.05)
            return (
                free_at_start,
                muxed.stream_backlog_semaphore.value,
                timed_out,
                await rpc.call(a, b.get_id(), FAST),
            )

    free_at_start, free_after, timed_out, answer = run(scenario)
    assert timed_out == 24
    assert free_after == free_at_start  # every slot back (it was 24 fewer)
    assert answer == {"ok": True}
