"""The operator's /dns addresses (a bootstrap's, `--via`'s, `status`'s) resolved as this
machine resolves names, before they are dialled.

py-libp2p resolves /dns, /dns4 and /dns6 with dnspython, which asks the configured DNS servers
only: a name listed in /etc/hosts (a LAN's bootstrap, a lab's) never resolved, and the dial's
error never said so. getaddrinfo asks what the system does (files, then DNS, as
/etc/nsswitch.conf says). A name is resolved again at every attempt, so a bootstrap that moved
is found at its new address. Only addresses the operator typed come here: a DNS name a peer
declares is never dialled (net/dial_gate.py).
"""

from __future__ import annotations

import socket

import trio
from libp2p.abc import IHost
from libp2p.peer.peerinfo import PeerInfo
from multiaddr import Multiaddr

from p2ptrain.net import dial_gate

# the name protocols and the address family each asks for
DNS_FAMILIES = {"dns": socket.AF_UNSPEC, "dns4": socket.AF_INET, "dns6": socket.AF_INET6}
MAX_RESOLVED = 4  # addresses tried per name: a name with many is a load balancer's


class CannotResolve(Exception):
    """A name of the operator's that this machine cannot resolve: said in those words."""


async def resolve_address(maddr: str) -> list[str]:
    """`maddr` itself unless it starts with /dns, /dns4 or /dns6; else the same address at each
    IP its name resolves to (at most MAX_RESOLVED), or CannotResolve."""
    parts = maddr.split("/")
    if len(parts) < 3 or parts[0] or parts[1] not in DNS_FAMILIES:
        return [maddr]
    name, rest = parts[2], "/".join(parts[3:])
    port = parts[4] if len(parts) > 4 and parts[3] in ("tcp", "udp") else None
    try:
        infos = await trio.socket.getaddrinfo(
            name, port, DNS_FAMILIES[parts[1]], socket.SOCK_STREAM
        )
    except (OSError, UnicodeError) as exc:  # gaierror; a name no IDNA codec takes
        why = getattr(exc, "strerror", None) or str(exc)
        raise CannotResolve(f"cannot resolve {name!r} ({why})") from None
    resolved: list[str] = []
    for family, _, _, _, sockaddr in infos:
        protocol = "ip4" if family == socket.AF_INET else "ip6"
        address = f"/{protocol}/{sockaddr[0]}" + (f"/{rest}" if rest else "")
        if address not in resolved:
            resolved.append(address)
    if not resolved:
        raise CannotResolve(f"cannot resolve {name!r} (no address of that family)")
    return resolved[:MAX_RESOLVED]


async def connect_operator_peer(host: IHost, info: PeerInfo) -> None:
    """host.connect to a peer the operator named, its /dns addresses resolved first (and let
    through the host's dial gate: the operator's word, as the name was)."""
    resolved: list[str] = []
    problems: list[str] = []
    for addr in info.addrs:
        try:
            resolved += await resolve_address(str(addr))
        except CannotResolve as exc:
            problems.append(str(exc))
    if not resolved:
        raise CannotResolve("; ".join(problems))
    for addr in resolved:
        dial_gate.trust(host, addr)
    await host.connect(PeerInfo(info.peer_id, [Multiaddr(addr) for addr in resolved]))
