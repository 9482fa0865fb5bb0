"""One gate for every connection a host opens, whoever asks: our code, Kademlia's lookups (the
routing-table refresh, get/put of records, find_peer), identify, pubsub, the auto-connector.

Other peers name addresses to the library as well as to us (a DHT answer's closer peers, a
signed peer record): each is a hint, never a target, or a hostile peer could aim a whole swarm's
lookups at a victim. So, at two places of py-libp2p's path:
- the peerstore (what every dial reads its addresses from) takes only addresses we may dial,
  the newest MAX_STORED_ADDRS per peer: a refused address never crowds out a good one;
- each transport's dial, the last step before a socket, opens a connection only to an address
  we may dial, and within one rate: ATTEMPTS_PER_ENDPOINT per endpoint and ATTEMPTS_PER_WINDOW
  in all per GATE_WINDOW_S (a refused dial raises before any packet).
"We may dial" is address_classes.may_dial against our own advertised addresses and this machine's
networks (a global address, or loopback / a private network of our own kind, a private address
only inside a network this machine is on: net/own_networks.py; never link-local, multicast,
reserved or a DNS name), or an IP a peer is connected to us from (what the network shows, not
what a peer says); never port 0.
Trusted endpoints pass without a rate: the bootstrap address the operator gave, our own local
routes (control/traversal.py).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError
from libp2p.transport.exceptions import OpenConnectionError
from multiaddr import Multiaddr

from p2ptrain.net.address_classes import (
    LOOPBACK_KIND,
    IPNetwork,
    ip_of,
    may_dial,
    network_kind,
    own_ips,
)
from p2ptrain.net.own_networks import machine_networks
from p2ptrain.net.ratelimit import WindowLimiter
from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)

GATE_WINDOW_S = 10.0
ATTEMPTS_PER_ENDPOINT = 4  # one dial and py-libp2p's 3 retries of it
# connection attempts per window, all endpoints together: discovery's 16 dials of 4 attempts
# each (control/discovery.py) fit, and 1,000 names handed out by Sybils get no more
ATTEMPTS_PER_WINDOW = 64
MAX_STORED_ADDRS = 16  # per peer in the peerstore (a peer record's bound too): the newest stay

_GATES: weakref.WeakKeyDictionary[IHost, DialGate] = weakref.WeakKeyDictionary()


class DialGate:
    """The rule and the rate for one host's outbound connections (module docstring)."""

    def __init__(
        self,
        own_addrs: Callable[[], Sequence[str]],
        seen_ips: Callable[[], Iterable[str]] = lambda: (),
        trusted: Iterable[str] = (),
        networks: Callable[[], Sequence[IPNetwork] | None] = machine_networks,
    ) -> None:
        self.own_addrs = own_addrs
        self.networks = networks  # this machine's (tests give their own)
        self.seen_ips = seen_ips
        self.trusted = {endpoint_key(addr) for addr in trusted}
        self.limiter = WindowLimiter(ATTEMPTS_PER_ENDPOINT, ATTEMPTS_PER_WINDOW, GATE_WINDOW_S)
        self.num_refused = 0
        self._log = SampledLog(log)  # the 1st refusal, then every 100th: no log flood

    def trust(self, maddr: str) -> None:
        """Let `maddr`'s endpoint through, unrated: an address the operator or we chose."""
        self.trusted.add(endpoint_key(maddr))

    def distrust(self, maddr: str) -> None:
        """Trust `maddr`'s endpoint no more (a route of ours that closed)."""
        self.trusted.discard(endpoint_key(maddr))

    def may_dial(self, maddr: str) -> bool:
        """The rule alone: a trusted endpoint, or an IP we may dial or are connected from."""
        if endpoint_key(maddr) in self.trusted:
            return True
        if _port_of(maddr) == 0:
            return False  # nothing listens at port 0: the OS would pick a port, or refuse
        ip = ip_of(maddr)
        if ip is None:
            return False  # a DNS name (not the operator's), or no IP address at all
        if may_dial(ip, own_ips(self.own_addrs()), self.networks()):
            return True
        # loopback is where relayed and punched connections come spliced from: no evidence
        return network_kind(ip) not in (None, LOOPBACK_KIND) and ip in set(self.seen_ips())

    def refusal(self, maddr: str, now: float) -> str:
        """'' if a connection attempt to `maddr` may go out at `now` (counted), else why not."""
        key = endpoint_key(maddr)
        if key in self.trusted:
            return ""
        why = ""
        if not self.may_dial(maddr):
            why = "not an address we dial"
        elif not self.limiter.allow(key, now):
            why = "over the outbound dial rate"
        if why:
            self.num_refused += 1
            self._log.event("refused", "refused a dial to %s: %s", key, why)
        return why


def endpoint_key(maddr: str) -> str:
    """/ip4|ip6|dns*/HOST/tcp|udp/PORT of a multiaddr (its /p2p/ and anything after cut)."""
    return "/".join(str(maddr).split("/")[:5])


def _port_of(maddr: str) -> int | None:
    """The TCP or UDP port of /ip4|ip6|dns*/HOST/tcp|udp/PORT..., else None."""
    parts = str(maddr).split("/")
    if len(parts) < 5 or parts[3] not in ("tcp", "udp"):
        return None
    port = parts[4]
    return int(port) if port.isascii() and port.isdigit() else None


def install(host: IHost, gate: DialGate) -> None:
    """Put `gate` in front of the host's peerstore and every transport's dials."""
    _GATES[host] = gate
    peerstore = host.get_peerstore()
    store = peerstore.add_addrs

    def add_addrs(peer_id: ID, addrs: Sequence[Multiaddr], ttl: int = 0) -> None:
        allowed = list(dict.fromkeys(addr for addr in addrs if gate.may_dial(str(addr))))
        if not allowed:  # a peer named with refused addresses only is not even stored
            return
        try:
            held = [addr for addr in peerstore.addrs(peer_id) if addr not in allowed]
        except PeerStoreError:  # not known yet, or expired
            held = []
        if len(held) + len(allowed) > MAX_STORED_ADDRS:
            # the newest stay: what identify says after a real connection outlives a flood
            peerstore.clear_addrs(peer_id)
            allowed = [*held, *allowed][-MAX_STORED_ADDRS:]
        store(peer_id, allowed, ttl)

    peerstore.add_addrs = add_addrs  # type: ignore[method-assign]
    for transport in cast(Any, host.get_network()).transport_manager.get_transports():
        for name in ("dial", "dial_with_source"):  # the second: DCUtR's punches
            dial = getattr(transport, name, None)
            if dial is not None:
                setattr(transport, name, _gated(gate, dial))


def gate_of(host: IHost) -> DialGate | None:
    return _GATES.get(host)


def trust(host: IHost, maddr: str) -> None:
    """DialGate.trust on the host's gate, if it has one."""
    gate = _GATES.get(host)
    if gate is not None:
        gate.trust(maddr)


def distrust(host: IHost, maddr: str) -> None:
    """DialGate.distrust on the host's gate, if it has one."""
    gate = _GATES.get(host)
    if gate is not None:
        gate.distrust(maddr)


def _gated(gate: DialGate, dial: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def gated_dial(maddr: Multiaddr, *args: Any) -> Any:
        why = gate.refusal(str(maddr), time.monotonic())
        if why:
            raise OpenConnectionError(f"dial to {maddr} refused: {why}")
        return await dial(maddr, *args)

    return gated_dial
