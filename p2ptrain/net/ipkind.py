"""What kind of network an IPv4 address is on, for deciding what a node may connect to.

A punch (net/relay.py) connects to an endpoint that others reported: it must be a host on the
same kind of network as the interface we reach our relay from, or a public one. A node on the
public internet never sends SYNs to loopback, private or link-local addresses (a volunteer's own
machine or LAN); a node whose own interface is private (a testbed namespace, a home LAN) or
loopback (tests) may reach its own kind. Multicast, broadcast, unspecified and reserved
addresses are never dialled.
"""

from __future__ import annotations

import ipaddress

GLOBAL, PRIVATE, LOOPBACK, NEVER = "global", "private", "loopback", "never"
PREFIX_BITS = 24  # one site, for per-prefix quotas (relay slots, circuits)


def kind(ip: str) -> str:
    """GLOBAL, PRIVATE (RFC 1918, shared 100.64/10, link-local), LOOPBACK or NEVER (not an
    IPv4 address one dials, or not an IPv4 address at all)."""
    try:
        address = ipaddress.IPv4Address(ip)
    except ValueError:
        return NEVER
    if address.is_loopback:
        return LOOPBACK
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return NEVER
    if address == ipaddress.IPv4Address("255.255.255.255"):
        return NEVER
    if address.is_private or address.is_link_local or address in _SHARED:
        return PRIVATE
    return GLOBAL if address.is_global else NEVER


_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT


def may_dial(target_ip: str, local_ip: str) -> bool:
    """Whether a node whose interface toward the swarm is `local_ip` may connect to `target_ip`:
    any public address, else only an address of its own kind of network."""
    target = kind(target_ip)
    if target == NEVER:
        return False
    return target == GLOBAL or target == kind(local_ip)


def prefix(ip: str) -> str:
    """The quota key of a peer's address: its /24 when public; '' (no per-prefix quota) on
    loopback and private networks, where every peer of a testbed or LAN shares one prefix."""
    if kind(ip) != GLOBAL:
        return ""
    return str(ipaddress.IPv4Network(f"{ip}/{PREFIX_BITS}", strict=False))
