"""The dial-back protocol between live py-libp2p hosts on loopback: a fresh connection, the peer
id checked by Noise, only the requester's own IP dialled, one bit per request, no answer on a
connection spliced from loopback (issue 26, finding 6), rate limits."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest
import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.net import probe
from p2ptrain.net.framing import FrameError, read_frame, write_frame
from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.net.ratelimit import WindowLimiter
from p2ptrain.records import DialBackRequest
from p2ptrain.traversal import dialback
from p2ptrain.traversal.dialback import (
    DialBackServer,
    dial_candidates,
    request_dial_back,
)
from tests.net.trio_run import run
from tests.net.victim import open_victim

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


@asynccontextmanager
async def requester_and_server(
    server_addrs: list[str] | None = None,
) -> AsyncIterator[tuple[IHost, IHost, DialBackServer]]:
    """a asks, b serves dial-backs (and pings); a is connected to b. b's own addresses are its
    loopback listener's (a swarm on one machine) unless `server_addrs` says otherwise."""
    a, b = make_host(os.urandom(32)), make_host(os.urandom(32))
    server = DialBackServer(lambda: full_addrs(b) if server_addrs is None else server_addrs)
    async with a.run(listen_addrs=LOOPBACK), b.run(listen_addrs=LOOPBACK):
        b.set_stream_handler(dialback.DIALBACK_PROTOCOL, server.handle)
        a.set_stream_handler(probe.PING_PROTOCOL, probe.handle_ping)
        await a.connect(info_from_p2p_addr(Multiaddr(full_addrs(b)[0])))
        yield a, b, server


def port_of(addr: str) -> int:
    return int(addr.split("/tcp/")[1].split("/")[0])


def test_a_listening_requester_is_reached_on_a_fresh_connection_and_stays_healthy() -> None:
    async def scenario() -> Any:
        async with requester_and_server() as (a, b, _):
            reply = await request_dial_back(a, b.get_id(), full_addrs(a))
            # the requester is as it was: one peer connected, and b still gets its probes
            connected = a.get_connected_peers()
            rtt_ms = await probe.measure_rtt_ms(b, a.get_id())
            return reply, full_addrs(a), connected, b.get_id(), rtt_ms

    reply, addrs, connected, server_id, rtt_ms = run(scenario)
    assert reply.reached and reply.error == ""
    assert [r.addr for r in reply.results] == [f"/ip4/127.0.0.1/tcp/{port_of(addrs[0])}"]
    assert reply.observed.startswith("/ip4/127.0.0.1/tcp/")
    assert port_of(reply.observed) != port_of(addrs[0])  # the request's own connection, outbound
    assert connected == [server_id]  # the dial-back's throwaway key never became a connection
    assert rtt_ms > 0


def test_the_peer_id_is_checked_and_the_reply_is_one_bit_not_one_per_port() -> None:
    async def scenario() -> Any:
        other = make_host(os.urandom(32))  # listens where the requester claims to be
        async with requester_and_server() as (a, b, _), other.run(listen_addrs=LOOPBACK):
            someone_else = full_addrs(other)[0].split("/p2p/")[0]
            with trio.socket.socket() as sock:  # a port with nothing listening
                await sock.bind(("127.0.0.1", 0))
                closed = f"/ip4/127.0.0.1/tcp/{sock.getsockname()[1]}"
            own = full_addrs(a)[0].split("/p2p/")[0]
            missed = await request_dial_back(a, b.get_id(), [someone_else, closed])
            reached = await request_dial_back(a, b.get_id(), [someone_else, closed, own])
            return missed, reached, own

    missed, reached, own = run(scenario)
    # neither "closed" nor "open but someone else's": nothing per port
    assert not missed.reached and missed.results == () and missed.error == ""
    # the one address that reached us (our own listener, proven by our key), nothing else
    assert reached.reached and [(r.addr, r.ok, r.error) for r in reached.results] == [
        (own, True, "")
    ]


def test_a_request_spliced_from_loopback_is_refused_without_a_dial() -> None:
    """A node on a real network sees relayed and punched connections come from 127.0.0.1
    (control/traversal.py): answering them would dial its own loopback at the requester's
    ports. Here b's own addresses say it is not on loopback, so a's request is such a one."""

    async def scenario() -> Any:
        server_addrs = ["/ip4/10.1.2.3/tcp/7401"]  # a LAN address: never sent anything
        async with open_victim() as victim, requester_and_server(server_addrs) as (a, b, _):
            reply = await request_dial_back(a, b.get_id(), [victim.addr, *full_addrs(a)])
            await trio.sleep(0.2)
            return reply, victim.connections

    reply, connections = run(scenario)
    assert reply.error == dialback.NOT_DIRECT and reply.results == () and not reply.reached
    assert connections == 0


def test_only_the_requesters_own_ip_is_dialled() -> None:
    addrs = [
        "/ip4/198.51.100.9/tcp/7401",  # a third party: never dialled as such
        "/ip4/203.0.113.7/tcp/7411/p2p/12D3KooWA1111111111111111111111111111111111111111111",
        "/ip4/203.0.113.7/tcp/22",  # a well-known port: never
        "/dns4/example.org/tcp/7401",
        "/ip4/10.0.0.5/tcp/7421",
        "/ip4/10.0.0.6/tcp/7431",
        "/ip4/10.0.0.7/tcp/7441",
    ]
    candidates = dial_candidates(addrs, "203.0.113.7")
    assert candidates == [
        ("203.0.113.7", 7411),
        ("203.0.113.7", 7401),
        ("203.0.113.7", 7421),
        ("203.0.113.7", 7431),
    ]  # at most 4, all on the observed IP
    assert dial_candidates(["/ip4/127.0.0.1/tcp/80"], "127.0.0.1") == []
    # a DNS name is not resolved: its port, at the observed IP
    assert dial_candidates(["/dns4/example.org/tcp/7401"], "203.0.113.7") == [("203.0.113.7", 7401)]


def test_requests_past_the_rate_limit_are_refused_without_a_dial() -> None:
    async def scenario() -> list[Any]:
        async with requester_and_server() as (a, b, server):
            server.members = dialback.RequestBudget(per_source=2, per_prefix=64, total=64)
            return [await request_dial_back(a, b.get_id(), full_addrs(a)) for _ in range(3)]

    replies = run(scenario)
    assert [r.reached for r in replies] == [True, True, False]
    assert replies[2].error == "rate limited" and replies[2].results == ()
    assert replies[2].time_s > 1e9  # the clock still answers: doctor's skew check


def test_a_window_limiter_counts_per_key_and_in_all() -> None:
    limiter = WindowLimiter(per_key=2, total=3, window_s=10.0)
    assert [limiter.allow("a", 0.0) for _ in range(3)] == [True, True, False]
    assert limiter.allow("b", 1.0) and not limiter.allow("c", 1.0)  # the total is spent
    assert limiter.allow("a", 10.0)  # a new window
    assert limiter.num_refused == 2


def test_a_bad_request_gets_no_reply_and_the_server_goes_on() -> None:
    async def scenario() -> Any:
        async with requester_and_server() as (a, b, _):
            answers = []
            for garbage in (b"not json", b'{"addrs": "all of them"}', b"[" * 5000):
                stream = await a.new_stream(b.get_id(), [dialback.DIALBACK_PROTOCOL])
                await write_frame(stream, garbage)
                with trio.fail_after(5), suppress(FrameError):
                    answers.append(await read_frame(stream, 1024))
            return answers, await request_dial_back(a, b.get_id(), full_addrs(a))

    answers, reply = run(scenario)
    assert answers == [] and reply.reached


def test_an_ipv6_host_is_limited_per_64_not_per_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """One host has a /64's addresses for free: each request from a fresh one of them was a
    fresh key, so one connected peer could spend the whole minute's 64. The dials are faked
    (a request with nothing to dial is not counted at all)."""
    server = dialback.DialBackServer(lambda: ["/ip4/203.0.113.1/tcp/7400"])
    peer = ID.from_base58("12D3KooWA1111111111111111111111111111111111111111111")

    async def no_dial(*args: Any) -> str:
        return "connect failed"

    monkeypatch.setattr(dialback, "dial_back", no_dial)

    async def ask(ip: str) -> str:
        reply = await server.answer(DialBackRequest(("/ip6/::1/tcp/7401",)), (ip, 40000), peer)
        return reply.error

    async def scenario() -> tuple[list[str], str]:
        same_64 = [
            await ask(f"2001:db8:1:2::{n + 1:x}") for n in range(dialback.REQUESTS_PER_IP + 1)
        ]
        return same_64, await ask("2001:db8:1:3::1")

    same_64, next_64 = run(scenario)
    assert same_64[:-1] == [""] * dialback.REQUESTS_PER_IP
    assert same_64[-1] == "rate limited"
    assert next_64 == ""
