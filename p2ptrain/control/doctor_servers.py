"""Whom `p2ptrain doctor` asks (control/doctor.py): the bootstrap at its own endpoint and up to
MAX_OTHER_SERVERS public peers its status lists, found within a bounded search, and what each of
them answers to a dial-back request (traversal/dialback.py).

The bootstrap's status is its word only: the peers it calls public are dialled at most
MAX_PEER_DIALS times, all within PEER_SEARCH_S.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from multiaddr import Multiaddr

from p2ptrain.control.observer import OBSERVER_TIMEOUT_S, fetch_status_doc
from p2ptrain.net.host import full_addrs
from p2ptrain.records import DialBackReply
from p2ptrain.traversal.dialback import ask_dial_back

CONNECT_TIMEOUT_S = 10.0
MAX_OTHER_SERVERS = 2  # public peers asked besides the bootstrap (dial-back and UDP)
MAX_PEER_DIALS = 8  # of the peers the bootstrap's status calls public, tried or not
PEER_SEARCH_S = 30.0  # the status fetch and those dials, all together


@dataclass(frozen=True)
class Server:
    """A peer we ask: its id, and where its UDP observer listens (its TCP endpoint)."""

    peer: ID
    endpoint: tuple[str, int] | None


async def public_peers(host: IHost, bootstrap: ID) -> list[Server]:
    """Up to MAX_OTHER_SERVERS public members the bootstrap knows of, connected: what its status
    lists is the bootstrap's word, so at most MAX_PEER_DIALS of them are dialled, and the whole
    search (status included) ends within PEER_SEARCH_S."""
    found: list[Server] = []
    with trio.move_on_after(PEER_SEARCH_S):
        try:
            with trio.fail_after(OBSERVER_TIMEOUT_S):
                status = await fetch_status_doc(host, bootstrap)
        except Exception:
            return []
        candidates = [p for p in status.peers if p.reachability == "public" and p.alive]
        for peer in candidates[:MAX_PEER_DIALS]:
            with trio.move_on_after(CONNECT_TIMEOUT_S / 2):
                try:  # any of it may be bad
                    peer_id = ID.from_base58(peer.id)
                    await host.connect(PeerInfo(peer_id, [Multiaddr(a) for a in peer.addrs]))
                    found.append(Server(peer_id, _remote_endpoint(host, peer_id)))
                except Exception:
                    continue
            if len(found) >= MAX_OTHER_SERVERS:
                break
    return found


def _remote_endpoint(host: IHost, peer: ID) -> tuple[str, int] | None:
    """The (ip, port) our connection to `peer` reached: where its UDP observer listens (its TCP
    endpoint), whichever of the addresses it lists that is."""
    with contextlib.suppress(Exception):
        for connection in host.get_network().get_connections(peer):
            address = getattr(connection.muxed_conn, "get_remote_address", lambda: None)()
            if address:
                return str(address[0]), int(address[1])
    return None


async def bootstrap_endpoint(maddr: str) -> tuple[str, int] | None:
    """The IPv4 (ip, port) of a bootstrap multiaddr, a DNS name resolved."""
    parts = maddr.split("/")
    if len(parts) < 5 or parts[3] != "tcp" or not (parts[4].isascii() and parts[4].isdigit()):
        return None
    if parts[1] == "ip4":
        return parts[2], int(parts[4])
    if parts[1] not in ("dns", "dns4"):
        return None
    try:
        infos = await trio.socket.getaddrinfo(parts[2], int(parts[4]), socket.AF_INET)
    except OSError:
        return None
    return (str(infos[0][4][0]), int(parts[4])) if infos else None


async def ask_dial_backs(
    host: IHost, servers: list[ID]
) -> tuple[list[DialBackReply | None], list[str | None]]:
    """Each server's reply (None: no answer) and the IP we see it at (whose opinion it is)."""
    replies: list[DialBackReply | None] = [None] * len(servers)
    server_ips: list[str | None] = [None] * len(servers)

    async def ask(index: int) -> None:
        with contextlib.suppress(Exception):
            replies[index], server_ips[index] = await ask_dial_back(
                host, servers[index], full_addrs(host)
            )

    async with trio.open_nursery() as nursery:
        for index in range(len(servers)):
            nursery.start_soon(ask, index)
    return replies, server_ips
