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
import weakref
from collections.abc import Sequence
from itertools import chain, zip_longest
from typing import Any

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
    resolved = addresses_of(infos, rest)
    if not resolved:
        raise CannotResolve(f"cannot resolve {name!r} (no address of that family)")
    return resolved


def addresses_of(infos: Sequence[tuple[Any, ...]], rest: str) -> list[str]:
    """getaddrinfo's answers as multiaddrs ending in `rest`, at most MAX_RESOLVED."""
    by_family: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        if family not in by_family or "%" in ip:  # a link-local scope: no multiaddr has one
            continue
        protocol = "ip4" if family == socket.AF_INET else "ip6"
        address = f"/{protocol}/{ip}" + (f"/{rest}" if rest else "")
        if address not in by_family[family]:
            by_family[family].append(address)
    # both families taken in turn: a name with many IPv6 addresses keeps its IPv4 ones, which
    # an IPv4-only machine needs
    pairs = zip_longest(by_family[socket.AF_INET], by_family[socket.AF_INET6])
    resolved = [address for address in chain.from_iterable(pairs) if address is not None]
    return resolved[:MAX_RESOLVED]


# per host, what each operator's address resolved to last: trusted by its dial gate until a
# later resolution no longer gives it (a name that moves does not grow the trusted set)
_RESOLVED: weakref.WeakKeyDictionary[IHost, dict[str, set[str]]] = weakref.WeakKeyDictionary()


async def connect_operator_peer(host: IHost, info: PeerInfo) -> None:
    """host.connect to a peer the operator named, its /dns addresses resolved first (and let
    through the host's dial gate: the operator's word, as the name was)."""
    resolved: list[Multiaddr] = []
    problems: list[str] = []
    last = _RESOLVED.setdefault(host, {})
    for addr in map(str, info.addrs):
        try:
            now = await resolve_address(addr)
        except CannotResolve as exc:
            problems.append(str(exc))
            continue
        for gone in last.get(addr, set()) - set(now):
            dial_gate.distrust(host, gone)
        last[addr] = set(now)
        for address in now:
            dial_gate.trust(host, address)
            resolved.append(Multiaddr(address))
    if not resolved:
        raise CannotResolve("; ".join(problems))
    # py-libp2p dials every address its peerstore holds for the peer (identify's too): only the
    # operator's, as discovery leaves only the one it chose for any other peer
    host.get_peerstore().clear_addrs(info.peer_id)
    await host.connect(PeerInfo(info.peer_id, resolved))
