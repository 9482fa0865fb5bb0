"""The host's dial gate (issue 26.5, what was left): py-libp2p's own Kademlia lookups dial the
addresses other peers return. A hostile DHT server answers every lookup of a live honest host
on 127.0.0.1 with peers of its choosing; the host never connects past the address rule or the
rate (net/dial_gate.py).

Nothing here may leave the machine: every TCP dial of every host is spied on below the gate,
and the spy refuses (no socket, no DNS) anything that is not loopback, so a gate that failed
would show in the spy's list, never on a wire."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
import varint
from libp2p.abc import IHost, INetStream
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL
from libp2p.kad_dht.kad_dht import KadDHT
from libp2p.kad_dht.pb.kademlia_pb2 import Message
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import PeerStoreError
from libp2p.transport.exceptions import OpenConnectionError
from libp2p.transport.tcp.tcp import TCP
from libp2p.utils.varint import read_varint_prefixed_bytes_limited
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control.dht_store import make_dht
from p2ptrain.net import dial_gate
from p2ptrain.net.dial_gate import ATTEMPTS_PER_ENDPOINT, ATTEMPTS_PER_WINDOW, GATE_WINDOW_S
from p2ptrain.net.host import make_host
from tests.net.trio_run import run
from tests.net.victim import Victim, open_victim

LOOPBACK = Multiaddr("/ip4/127.0.0.1/tcp/0")
REFUSED = ["/ip4/10.66.0.1/tcp/4001", "/ip4/169.254.169.254/tcp/80", "/ip4/192.168.9.9/tcp/22"]


@pytest.fixture
def dials(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address any host's TCP transport is asked to dial, below the gate; a non-loopback
    one is refused here, before any socket or name lookup."""
    seen: list[str] = []
    original = TCP.dial

    async def spy(self: TCP, maddr: Multiaddr) -> Any:
        seen.append(str(maddr))
        if not str(maddr).startswith("/ip4/127."):
            raise OpenConnectionError(f"the test never sends to {maddr}")
        return await original(self, maddr)

    async def spy_with_source(self: TCP, maddr: Multiaddr, source: tuple[str, int]) -> Any:
        return await spy(self, maddr)

    monkeypatch.setattr(TCP, "dial", spy)
    monkeypatch.setattr(TCP, "dial_with_source", spy_with_source)
    return seen


def fake_peer(addrs: Sequence[str]) -> Message.Peer:
    peer = Message.Peer()
    peer.id = ID.from_base58(identity.peer_id_of(os.urandom(32))).to_bytes()
    peer.addrs.extend(Multiaddr(a).to_bytes() for a in addrs)
    return peer


def hostile_kad(peers: list[Message.Peer]) -> Any:
    """A Kademlia server that answers every request with `peers` as the closer ones."""

    async def handler(stream: INetStream) -> None:
        try:
            while True:
                await read_varint_prefixed_bytes_limited(stream, 1 << 20)
                reply = Message(type=Message.MessageType.FIND_NODE)
                reply.closerPeers.extend(peers)
                data = reply.SerializeToString()
                await stream.write(varint.encode(len(data)) + data)
        except Exception:
            await stream.reset()

    return handler


@asynccontextmanager
async def honest_and_hostile(peers: list[Message.Peer]) -> AsyncIterator[tuple[IHost, KadDHT]]:
    """An honest gated host with a DHT whose only routing-table entry is the hostile server."""
    honest, hostile = make_host(os.urandom(32)), make_host(os.urandom(32))
    async with AsyncExitStack() as stack:
        for host in (honest, hostile):
            await stack.enter_async_context(host.run(listen_addrs=[LOOPBACK]))
        hostile.set_stream_handler(KAD_PROTOCOL, hostile_kad(peers))
        await honest.connect(PeerInfo(hostile.get_id(), hostile.get_addrs()))
        dht = make_dht(honest)
        info = PeerInfo(hostile.get_id(), hostile.get_addrs())
        await dht.routing_table.add_peer(info, skip_server_mode_check=True)
        yield honest, dht


async def lookups(dht: KadDHT, for_s: float) -> None:
    """The library's lookups a node runs: find_peer, the routing-table refresh, get and put."""
    with trio.move_on_after(for_s):
        for lookup in (
            lambda: dht.find_peer(ID.from_base58(identity.peer_id_of(os.urandom(32)))),
            dht.refresh_routing_table,
            lambda: dht.get_value("/p2ptrain/peer/nobody"),
            lambda: dht.put_value("/p2ptrain/peer/nobody", b"x"),
        ):
            # a lookup that finds nothing may raise: what we look at is what it dialled
            with contextlib.suppress(Exception):
                await lookup()


def test_lookups_never_dial_a_refused_address_class(dials: list[str]) -> None:
    async def scenario() -> tuple[IHost, list[list[str]]]:
        peers = [fake_peer(REFUSED) for _ in range(20)]
        async with honest_and_hostile(peers) as (host, dht):
            await lookups(dht, 6.0)
            stored = []
            for peer in peers:
                try:
                    stored.append([str(a) for a in host.get_peerstore().addrs(ID(peer.id))])
                except PeerStoreError:
                    stored.append([])
            return host, stored

    _, stored = run(scenario)
    assert all(dial.startswith("/ip4/127.0.0.1/") for dial in dials), dials
    assert stored == [[]] * 20  # refused addresses never reach the peerstore


def test_the_gate_refuses_before_the_transport_on_every_dial_path(dials: list[str]) -> None:
    async def scenario() -> int:
        host = make_host(os.urandom(32))
        async with host.run(listen_addrs=[LOOPBACK]):
            target = ID.from_base58(identity.peer_id_of(os.urandom(32)))
            for addr in [*REFUSED, "/dns4/victim.example/tcp/80"]:
                with pytest.raises(SwarmException):
                    await host.get_network().dial_addr(Multiaddr(addr), target)
            gate = dial_gate.gate_of(host)
            assert gate is not None
            return gate.num_refused

    assert run(scenario) >= 4
    assert dials == []  # refused above the transport: no socket, no name lookup


def test_a_flood_of_returned_addresses_is_dialled_within_the_rate(dials: list[str]) -> None:
    async def scenario() -> list[int]:
        async with AsyncExitStack() as stack:
            victims: list[Victim] = [
                await stack.enter_async_context(open_victim()) for _ in range(100)
            ]
            # each of 100 peers names every victim: 100 x 100 addresses handed out
            peers = [fake_peer([v.addr for v in victims[i:] + victims[:i]]) for i in range(100)]
            _, dht = await stack.enter_async_context(honest_and_hostile(peers))
            await lookups(dht, GATE_WINDOW_S - 2)  # one window of the rate
            await trio.sleep(0.2)  # the victims count their last connections
            return [v.connections for v in victims]

    connections = run(scenario)
    assert 0 < sum(connections) <= ATTEMPTS_PER_WINDOW
    assert max(connections) <= ATTEMPTS_PER_ENDPOINT


def test_the_rule_and_who_passes_it() -> None:
    gate = dial_gate.DialGate(
        lambda: ["/ip4/127.0.0.1/tcp/7401/p2p/X"],
        seen_ips=lambda: {"10.1.2.3", "127.0.0.1"},
        trusted=["/dns4/boot.example/tcp/7400/p2p/B", "/ip4/192.168.0.5/tcp/7400"],
    )
    assert gate.may_dial("/ip4/127.0.0.1/tcp/9")  # our own kind: a swarm on one machine
    assert gate.may_dial("/ip4/8.8.8.8/tcp/7401")  # global
    assert gate.may_dial("/ip4/10.1.2.3/tcp/7401")  # a peer is connected to us from there
    assert gate.may_dial("/dns4/boot.example/tcp/7400")  # the operator's bootstrap, a name
    assert gate.may_dial("/ip4/192.168.0.5/tcp/7400/p2p/B")
    assert not gate.may_dial("/ip4/192.168.0.5/tcp/7401")  # trust is per endpoint
    assert not gate.may_dial("/dns4/victim.example/tcp/80")  # a name a peer declares
    assert not gate.may_dial("/ip4/10.1.2.4/tcp/7401")
    assert not gate.may_dial("/ip4/169.254.169.254/tcp/80")

    off_loopback = dial_gate.DialGate(lambda: ["/ip4/8.8.4.4/tcp/7401"], lambda: {"127.0.0.1"})
    # relayed and punched connections come spliced from 127.0.0.1: that proves nothing
    assert not off_loopback.may_dial("/ip4/127.0.0.1/tcp/22")
    off_loopback.trust("/ip4/127.0.0.1/tcp/40000/p2p/R")  # our own route (control/traversal.py)
    assert off_loopback.may_dial("/ip4/127.0.0.1/tcp/40000")

    rated = dial_gate.DialGate(lambda: ["/ip4/127.0.0.1/tcp/1"])
    times = [rated.refusal(f"/ip4/127.0.0.1/tcp/{1000 + i // 8}", 0.0) for i in range(800)]
    assert times.count("") == ATTEMPTS_PER_WINDOW
    assert rated.refusal("/ip4/127.0.0.1/tcp/5", GATE_WINDOW_S) == ""  # a new window


def test_the_peerstore_keeps_allowed_addresses_only_and_the_newest_of_a_flood() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        host = make_host(os.urandom(32))
        async with host.run(listen_addrs=[LOOPBACK]):
            peerstore = host.get_peerstore()
            peer = ID.from_base58(identity.peer_id_of(os.urandom(32)))
            flood = [Multiaddr(f"/ip4/127.0.0.1/tcp/{20000 + i}") for i in range(40)]
            peerstore.add_addrs(peer, [*map(Multiaddr, REFUSED), *flood], 60)
            after_flood = [str(a) for a in peerstore.addrs(peer)]
            peerstore.add_addrs(peer, [Multiaddr("/ip4/127.0.0.1/tcp/7401")], 60)  # identify's
            return after_flood, [str(a) for a in peerstore.addrs(peer)]

    after_flood, after_identify = run(scenario)
    assert after_flood == [f"/ip4/127.0.0.1/tcp/{20000 + i}" for i in range(24, 40)]
    assert len(after_identify) == dial_gate.MAX_STORED_ADDRS
    assert after_identify[-1] == "/ip4/127.0.0.1/tcp/7401"
