"""Where a node listens and which addresses it tells others to dial (control and data plane).

A listener on 0.0.0.0 accepts on every interface, but 0.0.0.0 is no address to dial: the node
announces its interfaces' addresses instead. Loopback is announced only by a loopback listener
or on a machine with no other interface: a peer on another machine told to dial 127.0.0.1
would reach a node of its own (same default port), not us. `--announce` replaces the derivation
(a public IP in front of a NAT or a port-forwarding firewall); the data plane announces the same
hosts on its own port unless it is given its own list (`--announce-data`).

Which addresses a node may dial on someone else's word (address classes, the dial rule):
net/address_classes.py.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Sequence

from p2ptrain.errors import UserError, WireError
from p2ptrain.records import fields

BOOTSTRAP_LISTEN = "/ip4/0.0.0.0/tcp/7400"
JOIN_LISTEN = "/ip4/0.0.0.0/tcp/7401"  # the control plane (py-libp2p)
JOIN_DATA_LISTEN = "/ip4/0.0.0.0/tcp/7402"  # the data plane (the worker's p2pd)
LOOPBACK = "/ip4/127.0.0.1/tcp/0"  # this machine only, any port: many nodes on one machine
WILDCARD_IP4 = "0.0.0.0"
LOOPBACK_IP4 = "127.0.0.1"
# the source address of a route here is this machine's primary address; nothing is sent
_ROUTE_PROBE = ("192.0.2.1", 9)  # TEST-NET-1 (RFC 5737)


def tcp_endpoint(maddr: str) -> tuple[str, int] | None:
    """(H, P) of /ip4/H/tcp/P[/p2p/ID], else None."""
    parts = maddr.split("/")
    if len(parts) < 5 or parts[0] != "" or parts[1] != "ip4" or parts[3] != "tcp":
        return None
    port = parts[4]
    # 1-5 ASCII digits: str.isdigit() alone takes "²", which int() refuses
    if not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    if len(parts) > 5 and parts[5] != "p2p":
        return None
    return parts[2], int(port)


def listen_endpoint(maddr: str, flag: str) -> tuple[str, int]:
    """A listen address given by a user, as (IPv4 host, port): /ip4/H/tcp/P only."""
    endpoint = tcp_endpoint(maddr)
    if endpoint is None or not is_ip(endpoint[0], 4) or endpoint[1] > 65535:
        raise UserError(f"{flag} must be /ip4/HOST/tcp/PORT, not {maddr!r}")
    return endpoint


def listen_problem(host: str, port: int) -> str | None:
    """Why nothing can listen on (host, port) now, or None (port 0: any, never taken). py-libp2p
    and p2pd listen with SO_REUSEPORT, so a second node on a taken port would start beside the
    first, each getting some of its connections: a plain bind (TIME_WAIT allowed, as listeners
    have it) tells."""
    error = _bind_error(host, port)
    return None if error is None else _described(error, host, port)


def check_can_listen(maddr: str, flag: str) -> None:
    """UserError, in one line with what to do, if /ip4/HOST/tcp/PORT `maddr` cannot be listened
    on now (other forms are left to the listener)."""
    endpoint = tcp_endpoint(maddr)
    if endpoint is None or not is_ip(endpoint[0], 4) or endpoint[1] > 65535:
        return
    error = _bind_error(*endpoint)
    if error is None:
        return
    advice = _LISTEN_ADVICE.get(error.errno or 0)
    tail = f"; {advice}" if advice else ""
    raise UserError(f"{flag} {maddr}: cannot listen there: {_described(error, *endpoint)}{tail}")


_LISTEN_ADVICE = {
    errno.EADDRINUSE: "give each node on one machine its own port (or tcp/0: any free one)",
    errno.EADDRNOTAVAIL: "listen on 0.0.0.0 and give a public address with --announce",
}


def _bind_error(host: str, port: int) -> OSError | None:
    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def _described(error: OSError, host: str, port: int) -> str:
    if error.errno == errno.EADDRINUSE:
        return f"port {port} is in use (another node on this machine?)"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine"
    return error.strerror or repr(error)


def check_peer_address(maddr: str, flag: str) -> None:
    """UserError unless `maddr` is a multiaddr a peer record accepts, ending in /p2p/<peer id>
    (a node is dialled by its identity: any other peer there is refused)."""
    try:
        fields.multiaddr(maddr, flag, "address")
    except WireError as exc:
        raise UserError(f"{flag} {maddr!r}: {exc}") from None
    if "/p2p/" not in maddr:
        raise UserError(f"{flag} must end in /p2p/<peer id>: {maddr!r}")


def check_announce(maddrs: Sequence[str], flag: str) -> tuple[str, ...]:
    """Addresses given to announce: each one a peer record accepts (records/fields.py), with
    a fixed port (nobody can dial port 0), at most MAX_ADDRS of them."""
    if len(maddrs) > fields.MAX_ADDRS:
        raise UserError(f"{flag}: at most {fields.MAX_ADDRS} addresses")
    for maddr in maddrs:
        try:
            fields.multiaddr(maddr, flag, "address")
        except WireError as exc:
            raise UserError(f"{flag} {maddr!r}: {exc}") from None
        endpoint = tcp_endpoint(maddr)
        if "/tcp/" not in maddr or (endpoint is not None and endpoint[1] == 0):
            raise UserError(f"{flag} {maddr!r}: an announced address needs a TCP port other than 0")
    return tuple(maddrs)


def interface_ip4s() -> list[str]:
    """This machine's IPv4 addresses others may dial: up interfaces, no loopback, no link-local
    (169.254/16); the primary one (the source of the default route) first."""
    import psutil  # a multiaddr dependency: in every install, imported only where needed

    stats = psutil.net_if_stats()
    found: list[str] = []
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for addr in addrs:
            if addr.family == socket.AF_INET and _dialable_ip4(addr.address):
                found.append(addr.address)
    primary = _primary_ip4()
    return sorted(dict.fromkeys(found), key=lambda ip: ip != primary)


def expand(maddrs: Sequence[str], interfaces: Sequence[str]) -> list[str]:
    """What others should dial for these listen (or reported) addresses: 0.0.0.0 becomes each of
    `interfaces` on the same port; loopback is dropped when anything else remains. At most
    MAX_ADDRS, so that the peer record carrying them stays valid."""
    out: list[str] = []
    for maddr in maddrs:
        endpoint = tcp_endpoint(maddr)
        if endpoint is None or endpoint[0] != WILDCARD_IP4:
            out.append(maddr)
            continue
        _, _, rest = maddr.partition(f"/ip4/{WILDCARD_IP4}")
        out += [f"/ip4/{ip}{rest}" for ip in (interfaces or [LOOPBACK_IP4])]
    others = [a for a in out if not _is_loopback(a)]
    return list(dict.fromkeys(others or out))[: fields.MAX_ADDRS]


def with_port(maddrs: Sequence[str], port: int) -> tuple[str, ...]:
    """The same hosts on another TCP port (the data plane beside the control plane), /p2p/ cut."""
    out = []
    for maddr in maddrs:
        parts = maddr.split("/p2p/")[0].split("/")
        index = parts.index("tcp") if "tcp" in parts else -1
        if index < 0 or index + 1 >= len(parts):
            raise UserError(f"cannot derive a data-plane address from {maddr!r}: no TCP port")
        parts[index + 1] = str(port)
        out.append("/".join(parts))
    return tuple(dict.fromkeys(out))


def is_ip(text: str, version: int | None = None) -> bool:
    """Whether `text` is an IP address literal (of that version: 4 or 6), not a name."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return version is None or address.version == version


def _dialable_ip4(text: str) -> bool:
    ip = ipaddress.IPv4Address(text)
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def _is_loopback(maddr: str) -> bool:
    endpoint = tcp_endpoint(maddr)
    return (
        endpoint is not None
        and is_ip(endpoint[0], 4)
        and ipaddress.IPv4Address(endpoint[0]).is_loopback
    )


def _primary_ip4() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_ROUTE_PROBE)  # UDP connect: a route lookup, no packet
            return str(probe.getsockname()[0])
    except OSError:
        return None  # no route (an isolated namespace): the interfaces' order


def data_announce(
    announce: Sequence[str], announce_data: Sequence[str], data_port: int
) -> tuple[str, ...]:
    """What the data plane announces: `--announce-data`, else the hosts of `--announce` on the
    data plane's port, else nothing (the worker announces what p2pd reports, expanded)."""
    if announce_data:
        return check_announce(announce_data, "--announce-data")
    if not announce:
        return ()
    if data_port == 0:
        raise UserError("--announce needs a fixed --data-listen port (or --announce-data)")
    return with_port(check_announce(announce, "--announce"), data_port)
