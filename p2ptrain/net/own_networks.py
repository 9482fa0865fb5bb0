"""The networks this machine is on: what bounds the private addresses a peer may make us dial.

address_classes.may_dial lets a peer name a private address (RFC 1918, CGNAT, IPv6 ULA) only inside
one of these, never anywhere in the range: a volunteer on 192.168.1.5 is not aimed at a cloud
VPC's other subnets or the ISP's CGNAT block. They are
- each interface address with its netmask (IPv4: ioctl SIOCGIFCONF + SIOCGIFNETMASK; IPv6:
  /proc/net/if_inet6, which holds the prefix length), loopback included;
- each route of the routing table other than a default or a reject one (/proc/net/route: the
  main table; /proc/net/ipv6_route): the machine's own configuration says that network is
  reached from here, directly or through a gateway its operator set (the testbed's route to its
  NATs' 10.78.0.0/16, a VPN's or a LAN's static route). A route wider than a private range (a
  VPN's 0.0.0.0/1) is no statement about one: may_dial ignores networks wider than the range.
Read from the calling process's network namespace (/proc/net is /proc/self/net), cached for
REFRESH_S. Where they cannot be read (not Linux), machine_networks() is None and may_dial keeps
the range rule, said once in the log.
"""

from __future__ import annotations

import array
import fcntl
import ipaddress
import logging
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from p2ptrain.net.address_classes import IPNetwork

log = logging.getLogger(__name__)

REFRESH_S = 60.0  # interfaces and routes change rarely: a new one counts within a minute
PROC_NET = Path("/proc/net")
SIOCGIFCONF = 0x8912  # linux/sockios.h
SIOCGIFNETMASK = 0x891B
IFNAMSIZ = 16
# struct ifreq: a name and a union whose widest member is struct ifmap (two longs, a short and
# three chars, padded to a long): 40 bytes on 64-bit Linux, 32 on 32-bit
_LONG = struct.calcsize("L")
IFREQ_SIZE = IFNAMSIZ + -(-struct.calcsize("LLHBBB") // _LONG) * _LONG
_SIN_ADDR = IFNAMSIZ + 4  # sockaddr_in: family (2), port (2), then the address
RTF_UP = 0x1
RTF_REJECT = 0x200  # unreachable, prohibit, blackhole: no way there

_cache: tuple[float, tuple[IPNetwork, ...] | None] | None = None
_said_unreadable = False


def machine_networks(clock: Callable[[], float] = time.monotonic) -> tuple[IPNetwork, ...] | None:
    """This machine's networks (module docstring), at most REFRESH_S old; None if unreadable."""
    global _cache, _said_unreadable
    now = clock()
    if _cache is not None and now - _cache[0] < REFRESH_S:
        return _cache[1]
    networks = read_networks()
    if networks is None and not _said_unreadable:
        _said_unreadable = True
        log.warning(
            "cannot read this machine's interfaces (%s): a peer may make us dial any address"
            " of a private range we have an address in, not only our own networks",
            sys.platform,
        )
    _cache = (now, networks)
    return networks


def read_networks() -> tuple[IPNetwork, ...] | None:
    """Interface networks and routes, read now; None where the interfaces cannot be read."""
    if not sys.platform.startswith("linux"):
        return None  # the ioctl's numbers and struct layout, and /proc, are Linux's
    try:
        found: list[IPNetwork] = [iface.network for iface in ip4_interfaces()]
    except OSError as exc:
        log.debug("no IPv4 interface table: %s", exc)
        return None
    readers = (("if_inet6", parse_if_inet6), ("route", parse_route), ("ipv6_route", parse_route6))
    for name, parse in readers:
        try:
            text = (PROC_NET / name).read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # IPv6 off, or no /proc: the interfaces' IPv4 subnets still bound us
        found += parse(text)
    return tuple(dict.fromkeys(found))


def ip4_interfaces() -> list[ipaddress.IPv4Interface]:
    """Every IPv4 address of this machine with its netmask (ioctl: the stdlib has no call)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        size = 64 * IFREQ_SIZE
        while True:  # the kernel fills what fits: grow until something is left over
            buffer = array.array("B", bytes(size))
            ifconf = struct.pack("iL", size, buffer.buffer_info()[0])  # struct ifconf
            used = struct.unpack("iL", fcntl.ioctl(sock.fileno(), SIOCGIFCONF, ifconf))[0]
            if used < size:
                break
            size *= 2
        data = buffer.tobytes()[:used]
        found = []
        for offset in range(0, used - IFREQ_SIZE + 1, IFREQ_SIZE):
            request = data[offset : offset + IFREQ_SIZE]  # name and AF_INET address: that one's
            address = socket.inet_ntoa(request[_SIN_ADDR : _SIN_ADDR + 4])
            try:
                reply = fcntl.ioctl(sock.fileno(), SIOCGIFNETMASK, request)
            except OSError:  # gone since SIOCGIFCONF: the others still bound us
                continue
            mask = socket.inet_ntoa(reply[_SIN_ADDR : _SIN_ADDR + 4])
            found.append(ipaddress.IPv4Interface(f"{address}/{mask}"))
        return found


def parse_route(text: str) -> list[IPNetwork]:
    """/proc/net/route's usable routes other than the default: destination and mask are hex
    in the kernel's (native) byte order."""
    found: list[IPNetwork] = []
    for fields in _rows(text, 8):
        try:
            destination, flags, mask = int(fields[1], 16), int(fields[3], 16), int(fields[7], 16)
            network = ipaddress.IPv4Network(f"{_ip4(destination)}/{_ip4(mask)}", strict=False)
        except (ValueError, struct.error):
            continue  # the header, or a line that is no route
        if _usable(network, flags):
            found.append(network)
    return found


def _usable(network: IPNetwork, flags: int) -> bool:
    """A route that is up, not a reject one (no way there), and not the default."""
    return bool(flags & RTF_UP) and not flags & RTF_REJECT and network.prefixlen > 0


def parse_route6(text: str) -> list[IPNetwork]:
    """/proc/net/ipv6_route's usable routes other than the default (all tables)."""
    found: list[IPNetwork] = []
    for fields in _rows(text, 9):
        try:
            network = _ip6_network(fields[0], fields[1])
            flags = int(fields[8], 16)
        except ValueError:
            continue
        if _usable(network, flags):
            found.append(network)
    return found


def parse_if_inet6(text: str) -> list[IPNetwork]:
    """The network of each address in /proc/net/if_inet6 (address, index, prefix length, ...)."""
    found: list[IPNetwork] = []
    for fields in _rows(text, 3):
        try:
            found.append(_ip6_network(fields[0], fields[2]))
        except ValueError:
            continue
    return found


def _rows(text: str, min_fields: int) -> Iterable[list[str]]:
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= min_fields:
            yield fields


def _ip4(native: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(struct.pack("=I", native))  # native order: the wire's bytes


def _ip6_network(hex_address: str, hex_prefix: str) -> ipaddress.IPv6Network:
    if len(hex_address) != 32:
        raise ValueError(hex_address)
    address = ipaddress.IPv6Address(bytes.fromhex(hex_address))
    return ipaddress.IPv6Network((address, int(hex_prefix, 16)), strict=False)
