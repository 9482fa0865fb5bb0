"""Discovery is no reflector (issue 26, finding 5): a live node on 127.0.0.1 with a swarm of
Sybil records naming a "victim" listener outside the swarm. Each endpoint is dialled at most
once per window however many records name it, at most DIALS_PER_WINDOW endpoints in all, and
never an address of a kind we refuse (a DNS name; loopback for a node that is not on it)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control import discovery
from p2ptrain.control.dht_store import make_dht
from p2ptrain.control.discovery import DIALS_PER_WINDOW, MAX_ADDRS_PER_PEER, Discovery
from p2ptrain.control.membership import Member
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import SwarmView
from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.records import PeerRecord
from tests.net.trio_run import run
from tests.net.victim import Victim, open_victim
from tests.records.samples import peer_dict

ATTEMPTS_PER_DIAL = 4  # py-libp2p retries a failed dial 3 times (RetryConfig.max_retries)
ROUNDS = 3


def sybil(addrs: Sequence[str]) -> tuple[str, Member]:
    """A free identity whose record names `addrs`."""
    peer = identity.peer_id_of(os.urandom(32))
    record = PeerRecord.from_dict({**peer_dict(), "addrs": list(addrs), "role": "trainer"})
    return peer, Member(record, 0.0)


@asynccontextmanager
async def node(
    own_addrs: Sequence[str] | None = None, bootstrap: str | None = None
) -> AsyncIterator[Discovery]:
    """A discovery on a live loopback host; its own addresses are its listener's unless
    `own_addrs` says otherwise (a node on a LAN, say)."""
    seed = os.urandom(32)
    host = make_host(seed)
    async with host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        me = host.get_id().to_base58()
        view = SwarmView(self_id=me, role="control-only", planner_capable=False, started_at=0.0)
        state = NodeState(seed, "control-only", me, host, view, {})
        state.addrs = full_addrs(host) if own_addrs is None else list(own_addrs)
        yield Discovery(state, make_dht(host), bootstrap)


async def dial_rounds(disco: Discovery, members: dict[str, Member]) -> None:
    disco.state.view.members.update(members)
    for _ in range(ROUNDS):
        disco._last_dial.clear()  # every peer is due each round: only the budget holds
        await disco.dial_round()
    await trio.sleep(0.2)  # the victims count their last connections


def test_a_thousand_sybils_naming_one_victim_get_it_dialled_once() -> None:
    async def scenario() -> int:
        async with open_victim() as victim, node() as disco:
            forms = [victim.addr, f"{victim.addr}/p2p/{disco.state.peer_id}"]
            await dial_rounds(disco, dict(sybil(forms * 8) for _ in range(1000)))
            return victim.connections

    connections = run(scenario)
    assert 1 <= connections <= ATTEMPTS_PER_DIAL  # one dial (and the library's retries)


def test_many_victims_get_at_most_the_budget_in_all() -> None:
    async def scenario() -> list[int]:
        async with AsyncExitStack() as stack:
            victims: list[Victim] = [
                await stack.enter_async_context(open_victim()) for _ in range(2 * DIALS_PER_WINDOW)
            ]
            disco = await stack.enter_async_context(node())
            members = dict(sybil([victims[i % len(victims)].addr]) for i in range(200))
            await dial_rounds(disco, members)
            return [victim.connections for victim in victims]

    connections = run(scenario)
    assert sum(count > 0 for count in connections) == DIALS_PER_WINDOW
    assert sum(connections) <= DIALS_PER_WINDOW * ATTEMPTS_PER_DIAL


@pytest.mark.parametrize(
    ("own_addrs", "named"),
    [
        (None, "/dns4/localhost/tcp/{port}"),  # a name: never resolved, never dialled
        (["/ip4/10.1.2.3/tcp/7401"], "/ip4/127.0.0.1/tcp/{port}"),  # loopback, from a LAN node
        (["/ip4/10.1.2.3/tcp/7401"], "/ip6/::ffff:127.0.0.1/tcp/{port}"),
    ],
)
def test_addresses_of_a_refused_kind_are_never_dialled(
    own_addrs: list[str] | None, named: str
) -> None:
    async def scenario() -> int:
        async with open_victim() as victim, node(own_addrs) as disco:
            addr = named.format(port=victim.port)
            await dial_rounds(disco, dict(sybil([addr]) for _ in range(50)))
            return victim.connections

    assert run(scenario) == 0


def test_candidates_are_few_allowed_and_where_we_saw_the_peer_first(monkeypatch: Any) -> None:
    lan = (ipaddress.IPv4Network("192.168.1.0/24"),)  # this machine's network, not the real one's
    monkeypatch.setattr(discovery, "machine_networks", lambda: lan)

    async def scenario() -> Any:
        async with node(["/ip4/192.168.1.20/tcp/7401"]) as disco:
            declared = [
                "/ip4/127.0.0.1/tcp/7401",  # our machine: not on a LAN node's word
                "/ip4/169.254.169.254/tcp/80",  # link-local
                "/dns4/example.org/tcp/7401",
                "/ip4/10.0.0.5/tcp/7401",  # another private network than ours
                "/ip4/192.168.9.9/tcp/7401",  # our range, but no network this machine is on
                "/ip4/8.8.8.8/tcp/7401/p2p/12D3KooWX",
                "/ip4/192.168.1.7/tcp/7401",
                "/ip4/8.8.4.4/tcp/7401",
            ]
            first = disco.candidates("peer", declared)
            disco._seen_ips["peer"] = {"8.8.4.4"}
            return first, disco.candidates("peer", declared)

    first, seen_first = run(scenario)
    assert first == ["/ip4/8.8.8.8/tcp/7401", "/ip4/192.168.1.7/tcp/7401"]
    assert len(first) == MAX_ADDRS_PER_PEER
    assert seen_first == ["/ip4/8.8.4.4/tcp/7401", "/ip4/8.8.8.8/tcp/7401"]
    assert discovery.DIAL_WINDOW_S >= discovery.REDIAL_BACKOFF_S


def test_an_address_the_dialler_cannot_parse_is_skipped_and_the_next_one_dialled() -> None:
    """A signed record with `/ipfs/1` passed the records' check once, and the dial's
    Multiaddr() ended every control process that tried it; now that address costs one round
    and the next round dials the record's next one."""

    async def scenario() -> int:
        async with open_victim() as victim, node() as disco:
            peer, member = sybil([victim.addr])
            unparsable = "/ip4/8.8.8.8/tcp/4001/ipfs/1"  # refused by py-multiaddr
            record = dataclasses.replace(member.record, addrs=(unparsable, victim.addr))
            assert disco.candidates(peer, list(record.addrs))[0] == unparsable
            await dial_rounds(disco, {peer: Member(record, 0.0)})
            return victim.connections

    assert run(scenario) >= 1


def test_the_bootstrap_is_redialled_at_the_operators_name_resolved_again() -> None:
    """Joined once, a node redialled its bootstrap at the operator's /dns4 address through
    py-libp2p's resolver, which never reads /etc/hosts: after any disconnection a bootstrap
    named there was out of reach for good. `localhost` is in /etc/hosts: no DNS query."""

    async def scenario() -> bool:
        server = make_host(os.urandom(32))
        async with server.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            port = full_addrs(server)[0].split("/")[4]
            server_id = server.get_id().to_base58()
            named = f"/dns4/localhost/tcp/{port}/p2p/{server_id}"
            async with node(bootstrap=named) as disco:
                await disco._dial(server_id)
                return server.get_id() in disco.state.host.get_network().connections

    assert run(scenario)
