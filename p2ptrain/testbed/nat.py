"""Emulated NATs: a volunteer's home router, in the forwarder, for each peer that sits behind one.

Kinds (RFC 4787 terms):
  none       directly reachable at its own address (the default).
  cone       endpoint-independent mapping, address-and-port-dependent filtering ("port-restricted
             cone"): one private port keeps one public port whatever it sends to, and a packet
             from outside gets in only from an (address, port) the peer already sent to through
             that mapping. Simultaneous sends (UDP or TCP simultaneous open) punch a hole.
  symmetric  a new public port for every destination (address, port), chosen at random: what a
             rendezvous sees is not what another peer sees, so punching fails; only a relay works.

A NATed peer keeps its private address (10.77.x.y) inside its namespace; its packets leave with
the NAT's public address (10.78.x.y) and a mapped port, and nothing reaches it except through a
live mapping. Only TCP and UDP are translated; ICMP, other protocols and IP fragments to or from a
NATed peer are dropped (counted). Mappings expire after an idle time per protocol (no TCP state
tracking); traffic either way through a mapping keeps it alive. No hairpinning.

Per packet the NAT does one or two dict lookups and rewrites the address, the port and the
checksums incrementally (RFC 1624) with a sum precomputed per mapping.
"""

from __future__ import annotations

import ipaddress
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from p2ptrain.errors import UserError
from p2ptrain.testbed.topology_file import per_peer

NAT_TYPES = ("none", "cone", "symmetric")
TCP, UDP = 6, 17
PROTOCOL_NAMES = {TCP: "tcp", UDP: "udp"}
# Public ports are drawn at random (no port preservation, no sequence a peer could predict).
MIN_PUBLIC_PORT = 1024
SWEEP_INTERVAL_S = 1.0  # how often expired mappings are freed (lookups check expiry anyway)


def public_peer_address(index: int) -> str:
    """The public address of peer `index`'s NAT (10.78.0.1, 10.78.0.2, ...)."""
    return f"10.78.{index // 250}.{index % 250 + 1}"


def check_nat_type(nat_type: object) -> str:
    """A NAT type, validated."""
    if nat_type not in NAT_TYPES:
        raise UserError(f"a NAT type must be one of {', '.join(NAT_TYPES)}; got {nat_type!r}")
    return str(nat_type)


@dataclass(frozen=True)
class NatTimeouts:
    """How long a mapping lives without traffic, per protocol. Home routers keep idle TCP
    mappings for minutes and UDP ones for tens of seconds; tests set them short."""

    tcp_s: float = 120.0
    udp_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("tcp_s", "udp_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise UserError(f"NAT timeout {name} must be a finite number > 0, got {value!r}")

    def for_protocol(self, protocol: int) -> float:
        return self.tcp_s if protocol == TCP else self.udp_s

    def to_json(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class NatMapping:
    """One mapping as the control socket lists it."""

    peer: int
    protocol: str  # "tcp" or "udp"
    private_port: int
    public_address: str
    public_port: int
    remotes: list[str]  # "ip:port" allowed in: the destinations sent to through this mapping
    idle_s: float


def _words_sum(data: bytes) -> int:
    """One's complement sum of the 16-bit words of data (even length)."""
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    return _fold(total)


def _fold(total: int) -> int:
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _delta(old: bytes, new: bytes) -> int:
    """What to add to a one's complement sum when `old` is replaced by `new` (RFC 1624 eqn. 3:
    ~m + m'), folded to 16 bits."""
    return _fold((~_words_sum(old) & 0xFFFF) + _words_sum(new))


def _adjusted(checksum: int, delta: int) -> int:
    """The checksum after the change that `delta` describes."""
    return ~_fold((~checksum & 0xFFFF) + delta) & 0xFFFF


def _patch_checksum(packet: bytearray, offset: int, delta: int, udp: bool) -> None:
    checksum = int.from_bytes(packet[offset : offset + 2], "big")
    if udp and checksum == 0:
        return  # UDP without a checksum stays without
    checksum = _adjusted(checksum, delta)
    if udp and checksum == 0:
        checksum = 0xFFFF  # 0 would mean "no checksum"
    packet[offset : offset + 2] = checksum.to_bytes(2, "big")


class _Mapping:
    """One (protocol, private port[, destination]) -> public port binding and its filter."""

    __slots__ = (
        "delta_in",
        "delta_out",
        "last_s",
        "out_key",
        "private_port",
        "protocol",
        "public_port",
        "remotes",
        "timeout_s",
    )

    def __init__(
        self,
        out_key: tuple[Any, ...],
        protocol: int,
        private_port: bytes,
        public_port: bytes,
        address_delta: tuple[int, int],
        timeout_s: float,
    ) -> None:
        self.out_key = out_key
        self.protocol = protocol
        self.private_port = private_port
        self.public_port = public_port
        self.remotes: set[tuple[bytes, bytes]] = set()
        self.timeout_s = timeout_s
        self.last_s = 0.0
        # the transport checksum covers the pseudo-header's address and the port
        self.delta_out = _fold(address_delta[0] + _delta(private_port, public_port))
        self.delta_in = _fold(address_delta[1] + _delta(public_port, private_port))


class Nat:
    """The NAT in front of one peer: rewrites its outbound packets, filters its inbound ones."""

    __slots__ = (
        "address_delta",
        "inbound",
        "next_sweep_s",
        "outbound",
        "private_ip",
        "public_ip",
        "symmetric",
        "timeouts",
    )

    def __init__(
        self, nat_type: str, private_ip: bytes, public_ip: bytes, timeouts: NatTimeouts
    ) -> None:
        assert nat_type in ("cone", "symmetric")
        self.symmetric = nat_type == "symmetric"
        self.private_ip = private_ip
        self.public_ip = public_ip
        self.timeouts = timeouts
        # (out, in) deltas of the IPv4 header checksum for the address rewrite
        self.address_delta = (_delta(private_ip, public_ip), _delta(public_ip, private_ip))
        # cone: (protocol, private port); symmetric: (protocol, private port, (dst ip, dst port))
        self.outbound: dict[tuple[Any, ...], _Mapping] = {}
        self.inbound: dict[tuple[int, bytes], _Mapping] = {}  # (protocol, public port)
        self.next_sweep_s = 0.0

    def translate_out(self, packet: bytes, now_s: float) -> bytes | None:
        """The packet as it leaves the NAT (source rewritten), or None if dropped."""
        ihl = _transport_offset(packet)
        if ihl < 0:
            return None
        if now_s >= self.next_sweep_s:
            self.sweep(now_s)
        protocol = packet[9]
        private_port = packet[ihl : ihl + 2]
        remote = (packet[16:20], packet[ihl + 2 : ihl + 4])
        key = (protocol, private_port, remote) if self.symmetric else (protocol, private_port)
        mapping = self.outbound.get(key)
        if mapping is None or now_s - mapping.last_s > mapping.timeout_s:
            if mapping is not None:
                self._remove(mapping)
            mapping = self._open(key, protocol, private_port)
        mapping.last_s = now_s
        mapping.remotes.add(remote)
        out = bytearray(packet)
        out[12:16] = self.public_ip
        out[ihl : ihl + 2] = mapping.public_port
        _patch_checksum(out, 10, self.address_delta[0], udp=False)
        _patch_checksum(out, ihl + _checksum_offset(protocol), mapping.delta_out, protocol == UDP)
        return bytes(out)  # hashable slices: another NAT may look it up on its way in

    def translate_in(self, packet: bytes, now_s: float) -> bytearray | None:
        """The packet as the NAT lets it in (destination rewritten), or None if filtered."""
        ihl = _transport_offset(packet)
        mapping = None if ihl < 0 else self.inbound.get((packet[9], packet[ihl + 2 : ihl + 4]))
        if (
            mapping is None
            or now_s - mapping.last_s > mapping.timeout_s
            or (packet[12:16], packet[ihl : ihl + 2]) not in mapping.remotes
        ):
            return None
        mapping.last_s = now_s
        out = bytearray(packet)
        out[16:20] = self.private_ip
        out[ihl + 2 : ihl + 4] = mapping.private_port
        _patch_checksum(out, 10, self.address_delta[1], udp=False)
        _patch_checksum(out, ihl + _checksum_offset(packet[9]), mapping.delta_in, packet[9] == UDP)
        return out

    def _open(self, key: tuple[Any, ...], protocol: int, private_port: bytes) -> _Mapping:
        while True:
            public_port = random.randrange(MIN_PUBLIC_PORT, 65536).to_bytes(2, "big")
            if (protocol, public_port) not in self.inbound:
                break
        mapping = _Mapping(
            key,
            protocol,
            private_port,
            public_port,
            self.address_delta,
            self.timeouts.for_protocol(protocol),
        )
        self.outbound[key] = mapping
        self.inbound[(protocol, public_port)] = mapping
        return mapping

    def _remove(self, mapping: _Mapping) -> None:
        del self.outbound[mapping.out_key]
        del self.inbound[(mapping.protocol, mapping.public_port)]

    def sweep(self, now_s: float) -> None:
        """Free the mappings that have expired."""
        self.next_sweep_s = now_s + SWEEP_INTERVAL_S
        for mapping in [m for m in self.outbound.values() if now_s - m.last_s > m.timeout_s]:
            self._remove(mapping)

    def mappings(self, peer: int, now_s: float) -> list[NatMapping]:
        """The live mappings, for the control socket."""
        self.sweep(now_s)
        public = str(ipaddress.IPv4Address(self.public_ip))
        return [
            NatMapping(
                peer=peer,
                protocol=PROTOCOL_NAMES[m.protocol],
                private_port=int.from_bytes(m.private_port, "big"),
                public_address=public,
                public_port=int.from_bytes(m.public_port, "big"),
                remotes=sorted(
                    f"{ipaddress.IPv4Address(ip)}:{int.from_bytes(port, 'big')}"
                    for ip, port in m.remotes
                ),
                idle_s=round(now_s - m.last_s, 3),
            )
            for m in self.outbound.values()
        ]


def _transport_offset(packet: bytes) -> int:
    """Where the TCP/UDP header starts, or -1 for what the NAT does not translate (other
    protocols, fragments, truncated headers)."""
    protocol = packet[9]
    if protocol not in PROTOCOL_NAMES or packet[6] & 0x3F or packet[7]:  # MF flag or an offset
        return -1
    ihl = (packet[0] & 0x0F) * 4
    if len(packet) < ihl + (20 if protocol == TCP else 8):
        return -1
    return ihl


def _checksum_offset(protocol: int) -> int:
    return 16 if protocol == TCP else 6


def nat_from_topology_file(path: str | Path, names: Sequence[str]) -> dict[int, str]:
    """The optional "nat" object of a topology file: {peer name or index: NAT type}."""
    return per_peer(path, names, "nat", '{peer name: "none"|"cone"|"symmetric"}', check_nat_type)
