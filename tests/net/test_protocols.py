"""The probe and RPC protocols between two live py-libp2p hosts in one trio loop (loopback)."""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.errors import WireError
from p2ptrain.net import probe, rpc
from p2ptrain.net.framing import FrameError, read_frame, write_frame
from p2ptrain.net.host import full_addrs, make_host
from tests.net.trio_run import run

ECHO = TProtocol("/test/echo/1.0.0")


@asynccontextmanager
async def host_pair() -> AsyncIterator[tuple[IHost, IHost]]:
    a, b = make_host(os.urandom(32)), make_host(os.urandom(32))
    listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
    async with a.run(listen_addrs=listen), b.run(listen_addrs=listen):
        await a.connect(info_from_p2p_addr(Multiaddr(full_addrs(b)[0])))
        yield a, b


def test_host_offers_noise_only_and_full_addrs():
    async def scenario() -> list[str]:
        async with host_pair() as (a, _):
            return full_addrs(a)

    addrs = run(scenario)
    assert addrs[0].startswith("/ip4/127.0.0.1/tcp/") and "/p2p/12D3KooW" in addrs[0]
    from libp2p.security.noise.transport import PROTOCOL_ID as NOISE

    host = make_host(os.urandom(32))
    security = host.get_network().upgrader.security_multistream.transports  # type: ignore[attr-defined]
    assert list(security) == [NOISE]


def test_rtt_and_bandwidth_probes():
    async def scenario() -> tuple[float, float]:
        async with host_pair() as (a, b):
            b.set_stream_handler(probe.PING_PROTOCOL, probe.handle_ping)
            b.set_stream_handler(probe.BANDWIDTH_PROTOCOL, probe.handle_bandwidth)
            rtt_ms = await probe.measure_rtt_ms(a, b.get_id())
            mbps = await probe.measure_bandwidth_mbps(a, b.get_id(), 256 * 1024)
            return rtt_ms, mbps

    rtt_ms, mbps = run(scenario)
    assert 0 < rtt_ms < 1000
    assert mbps > 1


def test_an_rtt_probe_brings_the_far_ends_trailer_and_survives_a_bad_one():
    """Ping 2.0.0: the server's own word (the control plane's coordinate) follows the echoes;
    garbage there costs the coordinate, never the round trip (control/measuring.py)."""
    from p2ptrain.control.measuring import far_coordinate
    from p2ptrain.records.estimate import NetCoordinate

    coordinate = NetCoordinate((1.0, 2.0, 3.0), 4.0, 0.5)
    word = json.dumps(coordinate.to_dict()).encode()

    async def scenario() -> list[tuple[float, bytes]]:
        async with host_pair() as (a, b):
            results = []
            for trailer in (word, b"[" * 400, b"x" * 5000):
                handler = functools.partial(
                    probe.handle_ping, trailer=functools.partial(bytes, trailer)
                )
                b.set_stream_handler(probe.PING_PROTOCOL, handler)
                results.append(await probe.measure_rtt(a, b.get_id()))
            return results

    (rtt_ms, got), (_, nested), (_, long) = run(scenario)
    assert 0 < rtt_ms < 1000 and far_coordinate(got) == coordinate
    assert far_coordinate(nested) is None and far_coordinate(b"") is None
    assert len(long) == probe.MAX_TRAILER_BYTES and far_coordinate(long) is None


def test_bandwidth_server_refuses_oversized_requests():
    async def scenario() -> bytes:
        async with host_pair() as (a, b):
            b.set_stream_handler(probe.BANDWIDTH_PROTOCOL, probe.handle_bandwidth)
            stream = await a.new_stream(b.get_id(), [probe.BANDWIDTH_PROTOCOL])
            await stream.write(struct.pack(">I", probe.MAX_BANDWIDTH_PROBE_BYTES + 1))
            with trio.fail_after(5):
                try:
                    return await stream.read(1)  # closed without an acknowledgement
                except StreamEOF:
                    return b""

    assert run(scenario) == b""


def test_rpc_round_trip_and_frame_limit():
    async def respond(request: bytes) -> dict[str, Any]:
        return {"echo": request.decode()}

    async def scenario() -> tuple[Any, str]:
        async with host_pair() as (a, b):
            b.set_stream_handler(ECHO, rpc.make_handler(respond))
            reply = await rpc.call(a, b.get_id(), ECHO, b"hello")
            stream = await a.new_stream(b.get_id(), [ECHO])
            await write_frame(stream, b"x" * (rpc.MAX_REQUEST_BYTES + 1))  # server must refuse
            with trio.fail_after(5):
                try:
                    await read_frame(stream, 1024)
                    error = "answered"
                except FrameError as exc:
                    error = str(exc)
            return reply, error

    reply, error = run(scenario)
    assert reply == {"echo": "hello"}
    assert "closed" in error


def test_probe_to_a_peer_without_the_protocol_fails_cleanly():
    async def scenario() -> None:
        async with host_pair() as (a, b):
            await probe.measure_rtt_ms(a, b.get_id())

    with pytest.raises(BaseException):  # noqa: B017 - py-libp2p raises several types
        run(scenario)


def test_inbound_streams_past_the_per_peer_cap_are_refused() -> None:
    """Issue 11, attack 8: inbound streams were unbounded in number."""
    limits = rpc.InboundLimits(per_peer=2, total=3)
    release = trio.Event()

    async def slow(stream: Any) -> None:
        await release.wait()
        await stream.close()

    async def scenario() -> tuple[int, int]:
        async with host_pair() as (a, b):
            b.set_stream_handler(ECHO, limits.guard(slow))
            for _ in range(4):
                try:  # a refused stream may fail while it is still being opened
                    stream = await a.new_stream(b.get_id(), [ECHO])
                    await stream.write(b"x")
                except Exception:
                    pass
                await trio.sleep(0.3)  # let the handler take it
            refused = limits.num_refused
            release.set()
            return refused, len(limits._open)

    refused, num_peers_open = run(scenario)
    assert refused == 2 and num_peers_open <= 1


@pytest.mark.parametrize("reply", [b"\xff\xfe", b"[" * 100_000, b"{not json"])
def test_an_rpc_reply_that_is_not_json_is_the_wire_error(reply: bytes) -> None:
    """A peer's garbage reply was a bare JSONDecodeError, UnicodeDecodeError or RecursionError."""

    async def garbage(stream: Any) -> None:
        await read_frame(stream, 1024)
        await write_frame(stream, reply)
        await stream.close()

    async def scenario() -> str:
        async with host_pair() as (a, b):
            b.set_stream_handler(ECHO, garbage)
            try:
                await rpc.call(a, b.get_id(), ECHO, b"hello")
            except WireError as exc:
                return str(exc)
            return "decoded"

    assert run(scenario).startswith("malformed")
