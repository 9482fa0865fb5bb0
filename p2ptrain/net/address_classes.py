"""Address classes and the dial rule: which addresses a node may dial on someone else's word.

Address classes (`network_kind`) are the one rule for what a node dials on someone else's word
(a member's record, the DHT's answers, a dial-back request, a punch endpoint): a global address,
or a loopback or private one only when one of our own addresses is of the same kind, and a
private one only inside a network this machine is on (`may_dial`, net/own_networks.py); never
link-local, multicast, unspecified or reserved ones. An IPv6 address that a translator or
tunnel delivers to an IPv4 one (NAT64, 6to4, IPv4-compatible, SIIT) is that IPv4 address, and
passes only if it is global; Teredo, site-local and local-use NAT64 addresses never do.
`independence_key` says when two peers' addresses count as two opinions, `public_prefix` which
peers share a relay's quota. Pure stdlib (ipaddress): it reads no interface and opens no socket.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

# networks of one organisation (RFC 1918, the carrier-grade NAT range of RFC 6598, IPv6 ULA): a
# node dials an address in one of them only when it has an address in the same one itself
PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
# IPv6 prefixes whose last 32 bits are an IPv4 address that the packets go to: NAT64's well-known
# prefix (RFC 6052), IPv4-compatible (RFC 4291, deprecated) and SIIT's IPv4-translated (RFC 6145)
# addresses; 6to4 (RFC 3056) holds one in bits 16-48 (IPv6Address.sixtofour)
EMBEDDING_IP6 = tuple(
    ipaddress.IPv6Network(net) for net in ("64:ff9b::/96", "::/96", "::ffff:0:0:0/96")
)
# never dialled on a peer's word, whatever Python's is_global says (it changed across versions):
# local-use NAT64 (RFC 8215: its IPv4 address sits where the operator chose), Teredo (RFC 4380:
# obsolete, a client's NAT mapping as the peer claims it), site-local (deprecated, RFC 3879),
# documentation (RFC 9637), SRv6 segment ids (RFC 9602), the rest of ::/8 (::1: loopback, first)
REFUSED_IP6 = tuple(
    ipaddress.IPv6Network(net)
    for net in ("64:ff9b:1::/48", "2001::/32", "fec0::/10", "3fff::/20", "5f00::/16", "::/8")
)
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK_KIND = "loopback"
GLOBAL_KIND = "global"
INDEPENDENT_PREFIX_IP4 = 24  # two global addresses in one /24 (IPv6: /48) are one opinion
INDEPENDENT_PREFIX_IP6 = 48


def ip_of(maddr: str) -> str | None:
    """The IP of /ip4|ip6/IP/..., normalised; None for anything else (a DNS name included)."""
    parts = maddr.split("/")
    if len(parts) < 3 or parts[0] != "" or parts[1] not in ("ip4", "ip6"):
        return None
    try:
        return str(ipaddress.ip_address(parts[2]))
    except ValueError:
        return None


def network_kind(ip: str) -> str | None:
    """LOOPBACK_KIND, the private network holding `ip` (its CIDR), or GLOBAL_KIND; None for
    what nobody should make us dial: link-local, multicast, unspecified, reserved and
    documentation addresses, IPv6 forms carrying a non-global IPv4 address (NAT64's
    64:ff9b::10.0.0.5 reaches 10.0.0.5), REFUSED_IP6, and anything that is no IP."""
    address = _unmapped(ip)  # ::ffff:127.0.0.1 is loopback too
    if address is None:
        return None
    if address.is_loopback:
        return LOOPBACK_KIND
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ip4(address)
        if embedded is not None:
            # a translator's or tunnel's way to an IPv4 host: a peer on our own network would
            # name the host itself, and a private one is someone's LAN behind the translator
            return GLOBAL_KIND if _is_global(embedded) else None
        if any(address in network for network in REFUSED_IP6):
            return None
    for network in PRIVATE_NETWORKS:
        if address.version == network.version and address in network:
            return str(network)
    return GLOBAL_KIND if _is_global(address) else None


def _is_global(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return address.is_global and not address.is_multicast


def _embedded_ip4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one is delivered to (EMBEDDING_IP6, 6to4), else None."""
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in EMBEDDING_IP6) and not address.is_unspecified:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _unwrapped(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IPv4 address an IPv6 form (mapped, NAT64, 6to4, ...) carries, else `address`."""
    if isinstance(address, ipaddress.IPv6Address):
        return address.ipv4_mapped or _embedded_ip4(address) or address
    return address


def may_dial(ip: str, own_ips: Sequence[str], networks: Sequence[IPNetwork] | None) -> bool:
    """May we dial `ip` on someone else's word? A global address; a loopback one when one of
    ours is loopback (a swarm on one machine); a private one when one of ours is in the same
    range and `ip` is one of ours or inside one of `networks`, this machine's interface subnets
    and routes (net/own_networks.py): a LAN, never the rest of the range (a VPC's other
    subnets, the ISP's CGNAT block). `networks` None: unknown here, the range alone decides."""
    kind = network_kind(ip)
    if kind == GLOBAL_KIND:
        return True
    if kind is None or kind not in {network_kind(own) for own in own_ips}:
        return False
    if kind == LOOPBACK_KIND or networks is None:
        return True
    address = _unmapped(ip)
    if address is None:
        return False
    span = ipaddress.ip_network(kind)  # a network wider than the range (0.0.0.0/1) says nothing
    return any(_unmapped(own) == address for own in own_ips) or any(
        net.version == address.version and address in net and net.prefixlen >= span.prefixlen
        for net in networks
    )


def _unmapped(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `ip` names (::ffff:10.0.0.5 is 10.0.0.5), None for no IP."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def own_ips(maddrs: Sequence[str]) -> list[str]:
    """The IPs of our own multiaddrs (DNS names left out)."""
    return [ip for ip in map(ip_of, maddrs) if ip is not None]


def all_loopback(maddrs: Sequence[str]) -> bool:
    """Are all of these (our own) addresses loopback: a swarm on one machine?"""
    ips = own_ips(maddrs)
    return bool(ips) and all(network_kind(ip) == LOOPBACK_KIND for ip in ips)


def public_prefix(ip: str) -> str:
    """The /24 (IPv6: /48) holding a global address, which one operator cheaply holds many of;
    '' for any other address: on loopback or a private network (a testbed, a LAN) every peer
    shares one prefix, so per-prefix quotas (relay slots and circuits) do not apply there."""
    if network_kind(ip) != GLOBAL_KIND:
        return ""
    address = _unwrapped(ipaddress.ip_address(ip))  # 64:ff9b::8.8.8.8 is 8.8.8.8's /24
    prefix = INDEPENDENT_PREFIX_IP4 if address.version == 4 else INDEPENDENT_PREFIX_IP6
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


def independence_key(ip: str) -> str:
    """Peers whose addresses share a key are one opinion: a global address's public_prefix;
    any other address as it is (on a private network each address is a machine of its own)."""
    return public_prefix(ip) or str(ipaddress.ip_address(ip))
