"""Builds py-libp2p hosts the way we measured they work: Noise only, yamux, quiet logs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from p2ptrain import addresses
from p2ptrain.errors import UserError
from p2ptrain.net import dial_gate, inbound_gate, known_records, peer_book, yamux_credit
from p2ptrain.net.guard import guard_inbound_streams

# Loggers that report routine events (a peer closing a stream) at WARNING, 100+ times a run.
_NOISY_LOGGERS = (
    "libp2p.kad_dht",
    "libp2p.pubsub",
    "libp2p.network",
    "libp2p.host",
    "libp2p.stream_muxer",
    "libp2p.security",
    "libp2p.transport",
    "libp2p.peer",
    "libp2p.tools",
    "libp2p.records",
    "libp2p.relay",
    "libp2p.discovery",
    "async_service",
    "multiaddr",
)


class _DialBackFilter(logging.Filter):
    """py-libp2p logs, at ERROR, an inbound connection that ends after its Noise handshake: what
    a dial-back is by design (traversal/dialback.py), every few minutes on every node."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("fail to upgrade mux for peer")


_DIAL_BACK_FILTER = _DialBackFilter()


def quiet_library_logs(level: int = logging.ERROR) -> None:
    """Silence py-libp2p's noisy loggers below `level`; our own messages stay at INFO. A failed
    dial (a peer that left) is ours to report, sampled: py-libp2p's TCP transport logged each
    attempt at ERROR, four bare lines a dial (its loggers do not propagate: Python's last-resort
    handler printed them without time or name)."""
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    logging.getLogger("libp2p.transport.tcp").setLevel(max(level, logging.CRITICAL))
    # a stream a peer will not open is its caller's to handle (StreamFailure): the library also
    # logged each as a 7-line ERROR, one on the bootstrap per `p2ptrain status` (GossipSub tries
    # the observer, which speaks no /meshsub)
    logging.getLogger("libp2p.host.basic_host").setLevel(max(level, logging.CRITICAL))
    logging.getLogger("libp2p.network.swarm").addFilter(_DIAL_BACK_FILTER)  # a set: added once


def make_host(
    seed: bytes,
    announce: Sequence[str] = (),
    trusted: Sequence[str] = (),
    keeps: Callable[[str], bool] = lambda _: False,
) -> IHost:
    """A host for the Ed25519 seed with Noise as the only security (no plaintext) and yamux,
    whose every inbound stream runs guarded: a handler's exception, ours or the library's,
    resets that stream only (net/guard.py), and whose every outbound connection passes the dial
    gate (net/dial_gate.py; `trusted`: the addresses the operator gave, let through). It
    advertises `announce` if given, else its listen addresses with 0.0.0.0 replaced by this
    machine's interface addresses (p2ptrain/addresses.py): identify, the DHT and our peer record
    all hand out get_addrs(), and nobody can dial 0.0.0.0. A full peerstore forgets strangers
    only, never `keeps` (base58 ids: the run's members) nor connected peers (net/peer_book.py)."""
    key_pair = create_new_key_pair(seed)
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    interfaces = [] if announce else addresses.interface_ip4s()  # once, not per identify
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt=cast(Any, {YAMUX_PROTOCOL_ID: Yamux}),
        **_advertising(announce, interfaces),
    )
    guard_inbound_streams(host)

    def own_addrs() -> list[str]:
        """What we advertise, less what peers say they observe us at (they could name any
        network as ours): the gate's measure of which networks are ours."""
        listening = [str(addr) for addr in host.get_transport_addrs()]
        return list(announce) or addresses.expand(listening, interfaces)

    dial_gate.install(host, dial_gate.DialGate(own_addrs, lambda: connection_ips(host), trusted))
    inbound_gate.install(host)  # an inbound connection's slot ends with it; PER_SOURCE each
    peer_book.install(host, keeps)  # a full peerstore forgets strangers, never our own keys
    known_records.install(host)  # a sender's unchanged peer record is not checked per RPC
    yamux_credit.install()  # a window update per half window read, not per message
    return host


def _advertising(announce: Sequence[str], interfaces: list[str]) -> dict[str, Any]:
    if announce:
        return {"announce_addrs": [parse_multiaddr(a) for a in announce]}

    def advertised(candidates: list[Multiaddr]) -> list[Multiaddr]:
        return [Multiaddr(a) for a in addresses.expand([str(c) for c in candidates], interfaces)]

    return {"addrs_factory": advertised}


def remote_ip(host: IHost, peer: str) -> str | None:
    """An IP our open connections to `peer` come from (None: not connected, or unknown)."""
    return min(connection_ips(host, peer), default=None)


def connection_ips(host: IHost, peer: str | None = None) -> set[str]:
    """The remote IPs of our open connections (to `peer`, or to anyone), as our sockets see
    them."""
    try:
        network = host.get_network()
        connections = network.get_connections(None if peer is None else ID.from_base58(peer))
    except Exception:  # not a peer id, or no such connection list
        return set()
    ips = set()
    for connection in connections:
        with contextlib.suppress(Exception):
            address = getattr(connection.muxed_conn, "get_remote_address", lambda: None)()
            if address:
                ips.add(str(address[0]))
    return ips


def parse_multiaddr(text: str, *, need_peer_id: bool = False) -> Multiaddr:
    """Parse a multiaddr given by a user; loopback/LAN only is up to the caller."""
    try:
        maddr = Multiaddr(text)
    except Exception as exc:  # multiaddr raises several unrelated types
        raise UserError(f"not a multiaddr: {text!r} ({exc})") from exc
    if need_peer_id and "/p2p/" not in str(maddr):
        raise UserError(f"multiaddr must end in /p2p/<peer id>: {text!r}")
    return maddr


def full_addrs(host: IHost) -> list[str]:
    """The host's listen addresses, each ending in /p2p/<peer id>."""
    peer_id = host.get_id().to_base58()
    addrs = []
    for addr in host.get_addrs():
        text = str(addr)
        addrs.append(text if "/p2p/" in text else f"{text}/p2p/{peer_id}")
    return addrs


def listen_endpoint(host: IHost) -> tuple[str, int] | None:
    """(IPv4 host, TCP port) the host's first TCP listener is bound to (port 0 resolved), else
    None: where the node's UDP address observer listens too (traversal/nat_probe.py)."""
    listeners = getattr(host.get_network(), "listeners", {})
    for listener in listeners.values():
        for addr in listener.get_addrs():
            endpoint = addresses.tcp_endpoint(str(addr))
            if endpoint is not None:
                return endpoint
    return None


def run_trio(main: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """trio.run(main, *args), less py-libp2p's teardown race: it can raise "Nursery is closed"
    while its host shuts down, after the work is done. Anything else is raised (as trio raises
    it: in an exception group, for the caller's `except*`)."""
    try:
        trio.run(main, *args)
    except* RuntimeError as group:
        if not all("Nursery is closed" in str(e) for e in group.exceptions):
            raise
