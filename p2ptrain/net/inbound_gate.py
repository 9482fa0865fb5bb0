"""The inbound side of a host's connections: each ends its slot when it ends, and one source
may hold only so many.

py-libp2p 0.8.1 admits an inbound connection only while its `_inbound_limiter` (250 slots:
max_connections less min_connections) has one free, and the handler holding a slot waits for
the whole swarm to stop before it gives the slot back, not for its connection to end. So after
250 inbound connections in a node's life (joins, reconnects, a stranger connecting in a loop),
every later one was refused before its handshake: a bootstrap stopped admitting anyone.

We wrap the swarm's `upgrade_inbound_raw_conn`, which that handler awaits between taking the
slot and parking: called by the handler (a context variable its task sets), after the upgrade
we wait for the connection to end and then raise, and the handler's own `except` closes the
(closed) raw connection and returns, releasing the slot; other callers (DCUtR's and circuit
relay v2's upgrades, which we do not run) get the connection back as before. The
same wrapper refuses, before any byte is read, a connection from a source (an IPv4 address, an
IPv6 /64) that already holds PER_SOURCE connections or handshakes, or from an IPv6 site (a /48,
what one customer is routinely given: 65,536 /64s) that holds PER_SITE: one host, or one
network of addresses that cost nothing, cannot take the slots. Loopback is exempt: a machine's own peers (tests, `local`) and traversal's relayed and
punched circuits (control/traversal.py, capped there) arrive from 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from libp2p.abc import IHost
from libp2p.network.exceptions import SwarmException

from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)

PER_SOURCE = 8  # connections held or being upgraded per source; a peer keeps 1-3 (NATs share)
PER_SITE = 32  # per IPv6 /48: a site's many volunteers fit, a /48's free /64s do not
Upgrade = Callable[[Any, Any], Awaitable[Any]]
# set in the task of the library's inbound-connection handler (each trio task has its context)
_IN_HANDLER: ContextVar[bool] = ContextVar("p2ptrain_inbound_handler", default=False)


class ConnectionEnded(Exception):
    """Raised once an upgraded inbound connection has ended: the library's handler returns."""


def source_of(ip: str | None) -> str | None:
    """The source an inbound connection counts against: its IPv4 address, its IPv6 /64 (an
    IPv4-mapped one as IPv4); None (not counted) for loopback or an address we cannot read."""
    try:
        address = ipaddress.ip_address(ip or "")
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


def site_of(ip: str | None) -> str | None:
    """The IPv6 /48 an inbound connection also counts against; None for IPv4 (an address is
    scarce there, and its source already the address), loopback or an unreadable address."""
    source = source_of(ip)
    if source is None or "/" not in source:
        return None
    return str(ipaddress.IPv6Network(source).supernet(new_prefix=48))


class InboundGate:
    """Counts each source's (and IPv6 site's) inbound connections from the upgrade's start to
    the connection's end; `source`, `site`: how a remote IP is counted (source_of, site_of)."""

    def __init__(
        self,
        per_source: int = PER_SOURCE,
        source: Callable[[str | None], str | None] = source_of,
        per_site: int = PER_SITE,
        site: Callable[[str | None], str | None] = site_of,
    ) -> None:
        self.per_source = per_source
        self.source = source
        self.per_site = per_site
        self.site = site
        self.held: Counter[str] = Counter()
        self.num_refused = 0
        self._log = SampledLog(log)

    def wrap(self, upgrade: Upgrade) -> Upgrade:
        async def gated(raw_conn: Any, maddr: Any) -> Any:
            remote = (
                raw_conn.get_remote_address() if hasattr(raw_conn, "get_remote_address") else None
            )
            ip = remote[0] if remote else None
            counted = [
                (key, cap)
                for key, cap in ((self.source(ip), self.per_source), (self.site(ip), self.per_site))
                if key is not None
            ]
            full = next(((key, cap) for key, cap in counted if self.held[key] >= cap), None)
            if full is not None:
                self.num_refused += 1
                self._log.event("refused", "refused an inbound connection from %s: %d held", *full)
                await raw_conn.close()
                raise SwarmException(f"{full[0]} holds {full[1]} inbound connections")
            for key, _ in counted:
                self.held[key] += 1
            try:
                muxed = await upgrade(raw_conn, maddr)
                ending = getattr(muxed, "event_shutting_down", None)
                if ending is None or not _IN_HANDLER.get():  # the caller keeps the connection
                    return muxed
                await ending.wait()
            finally:
                for key, _ in counted:
                    self.held[key] -= 1
                    if not self.held[key]:
                        del self.held[key]
            raise ConnectionEnded("the connection ended")

        return gated


def install(host: IHost, gate: InboundGate | None = None) -> InboundGate:
    """Wrap the host's inbound upgrades with `gate` (a fresh one by default); the gate."""
    gate = InboundGate() if gate is None else gate
    swarm: Any = host.get_network()
    handle = swarm._do_handle_inbound_connection

    async def handled(*args: Any, **kwargs: Any) -> Any:
        _IN_HANDLER.set(True)
        return await handle(*args, **kwargs)

    swarm._do_handle_inbound_connection = handled
    swarm.upgrade_inbound_raw_conn = gate.wrap(swarm.upgrade_inbound_raw_conn)
    return gate
