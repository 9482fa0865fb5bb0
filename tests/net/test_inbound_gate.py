"""The inbound side of a host's connections (net/inbound_gate.py): a connection's slot in
py-libp2p's inbound limiter ends with the connection (it used to end with the swarm, so a node
refused every inbound connection after 250 in its life), and one source holds at most so many."""

from __future__ import annotations

import contextlib
import itertools
import os

import pytest
import trio
from libp2p.abc import IHost
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.net import inbound_gate
from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.net.inbound_gate import InboundGate, site_of, source_of
from tests.net.trio_run import run

LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


async def _wait_for(predicate: object) -> None:
    with trio.fail_after(10):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 - no event to wait on
            await trio.sleep(0.05)


async def _connect_and_close(server: IHost) -> bool:
    """A fresh identity connects to `server` and closes its connection; did it connect?"""
    client = make_host(os.urandom(32))
    async with client.run(listen_addrs=LISTEN):
        try:
            with trio.fail_after(10):
                await client.connect(info_from_p2p_addr(Multiaddr(full_addrs(server)[0])))
        except Exception:
            return False
        for connection in list(client.get_network().get_connections()):
            await connection.close()
    return True


def test_an_inbound_connection_gives_its_slot_back_when_it_ends() -> None:
    """With 3 inbound slots, six connections one after the other all get in (the 4th was
    refused: each ended connection kept its slot until the swarm stopped)."""

    async def scenario() -> tuple[list[bool], float]:
        server = make_host(os.urandom(32))
        swarm = server.get_network()
        swarm._inbound_limiter = trio.CapacityLimiter(3)  # type: ignore[attr-defined]
        async with server.run(listen_addrs=LISTEN):
            connected = []
            for _ in range(6):
                connected.append(await _connect_and_close(server))
                await _wait_for(lambda: not swarm.get_connections())
            limiter = swarm._inbound_limiter  # type: ignore[attr-defined]
            await _wait_for(lambda: limiter.borrowed_tokens == 0)
            return connected, limiter.borrowed_tokens

    connected, borrowed = run(scenario)
    assert connected == [True] * 6
    assert borrowed == 0


def _gate_for(counted: str) -> tuple[InboundGate, str]:
    """A gate with room for 2 connections from one host, or from one site of many hosts (each
    connection a fresh /64 of one /48); loopback is counted here."""
    if counted == "host":
        return InboundGate(per_source=2, source=lambda ip: "one host"), "one host"
    fresh = itertools.count()
    return InboundGate(
        source=lambda ip: f"2001:db8:1:{next(fresh)}::/64", per_site=2, site=lambda ip: "one site"
    ), "one site"


@pytest.mark.parametrize("counted", ["host", "site"])
def test_a_source_holds_at_most_its_share_and_gets_room_back_as_one_ends(counted: str) -> None:
    gate, key = _gate_for(counted)

    async def scenario() -> tuple[int, bool, bool]:
        server = make_host(os.urandom(32))
        inbound_gate.install(server, gate)
        async with server.run(listen_addrs=LISTEN), contextlib.AsyncExitStack() as stack:
            info = info_from_p2p_addr(Multiaddr(full_addrs(server)[0]))
            clients = [make_host(os.urandom(32)) for _ in range(3)]
            for client in clients:
                await stack.enter_async_context(client.run(listen_addrs=LISTEN))
            for client in clients[:2]:
                await client.connect(info)
            await _wait_for(lambda: gate.held[key] == 2)
            try:
                with trio.fail_after(10):
                    await clients[2].connect(info)
                third = True
            except Exception:
                third = False
            refused = gate.num_refused
            for connection in list(clients[0].get_network().get_connections()):
                await connection.close()
            await _wait_for(lambda: gate.held[key] == 1)
            return refused, third, await _connect_and_close(server)

    refused, third, after = run(scenario)
    assert not third and refused >= 1
    assert after  # room again once one of its connections ended


def test_sources_are_hosts_and_ipv6_networks_and_loopback_is_not_counted() -> None:
    assert source_of("203.0.113.7") == "203.0.113.7"
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9")
    assert source_of("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("::ffff:203.0.113.7") == "203.0.113.7"
    assert source_of("127.0.0.1") is None and source_of("::1") is None
    assert source_of(None) is None and source_of("not an ip") is None


def test_ipv6_sites_are_48s_and_ipv4_has_none() -> None:
    assert site_of("2001:db8:1:2::1") == site_of("2001:db8:1:ffff::9") == "2001:db8:1::/48"
    assert site_of("2001:db8:2:2::1") != site_of("2001:db8:1:2::1")
    assert site_of("203.0.113.7") is None and site_of("::ffff:203.0.113.7") is None
    assert site_of("::1") is None and site_of(None) is None
