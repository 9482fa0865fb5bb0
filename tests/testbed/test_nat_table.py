"""The NAT table on hand-made packets: mapping, filtering, expiry and checksums (no root)."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest

from p2ptrain.errors import UserError
from p2ptrain.testbed.nat import (
    TCP,
    UDP,
    Nat,
    NatTimeouts,
    check_nat_type,
    nat_from_topology_file,
    public_peer_address,
)

PRIVATE, PUBLIC = bytes([10, 77, 0, 3]), bytes([10, 78, 0, 3])
REMOTE, OTHER = bytes([10, 77, 0, 1]), bytes([10, 77, 0, 2])
STRANGER = bytes([10, 78, 0, 9])


def checksum(data: bytes) -> int:
    """The Internet checksum, computed in full (what the kernel checks)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def packet(
    protocol: int, src: bytes, sport: int, dst: bytes, dport: int, payload: bytes = b"x" * 11
) -> bytes:
    """A valid IPv4 TCP or UDP packet (odd payload length: the checksum pads it)."""
    if protocol == TCP:
        header = struct.pack("!HHIIBBHHH", sport, dport, 7, 0, 5 << 4, 0x02, 65535, 0, 0)
    else:
        header = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    segment = bytearray(header + payload)
    pseudo = src + dst + struct.pack("!BBH", 0, protocol, len(segment))
    at = 16 if protocol == TCP else 6
    segment[at : at + 2] = struct.pack("!H", checksum(pseudo + bytes(segment)) or 0xFFFF)
    fields = (0x45, 0, 20 + len(segment), 1, 0x4000, 64, protocol, 0, src, dst)  # DF set
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", *fields))
    ip[10:12] = struct.pack("!H", checksum(bytes(ip)))
    return bytes(ip + segment)


def assert_valid(data: bytes | bytearray) -> None:
    """Both checksums verify (a sum over the covered bytes, checksum included, is zero)."""
    data = bytes(data)
    assert checksum(data[:20]) == 0
    pseudo = data[12:20] + struct.pack("!BBH", 0, data[9], len(data) - 20)
    assert checksum(pseudo + data[20:]) == 0


def ports(data: bytes | bytearray) -> tuple[int, int]:
    return struct.unpack("!HH", bytes(data[20:24]))


def nat(nat_type: str, timeout_s: float = 30.0) -> Nat:
    return Nat(nat_type, PRIVATE, PUBLIC, NatTimeouts(tcp_s=timeout_s, udp_s=timeout_s))


@pytest.mark.parametrize("protocol", [TCP, UDP])
def test_translation_rewrites_addresses_and_keeps_checksums_valid(protocol: int) -> None:
    random.seed(3)
    table = nat("cone")
    for sport in random.sample(range(1, 65536), 50):
        out = table.translate_out(packet(protocol, PRIVATE, sport, REMOTE, 443), 0.0)
        assert out is not None and out[12:16] == PUBLIC and out[16:20] == REMOTE
        assert_valid(out)
        public_port = ports(out)[0]
        reply = packet(protocol, REMOTE, 443, PUBLIC, public_port)
        back = table.translate_in(reply, 0.0)
        assert back is not None and back[16:20] == PRIVATE and ports(back) == (443, sport)
        assert_valid(back)


def test_a_udp_packet_without_checksum_stays_without() -> None:
    raw = bytearray(packet(UDP, PRIVATE, 5000, REMOTE, 53))
    raw[26:28] = b"\0\0"
    out = nat("cone").translate_out(bytes(raw), 0.0)
    assert out is not None and out[26:28] == b"\0\0"
    assert checksum(out[:20]) == 0


def test_cone_maps_one_port_for_every_destination_and_filters_by_endpoint() -> None:
    table = nat("cone")
    to_remote = table.translate_out(packet(UDP, PRIVATE, 5000, REMOTE, 7000), 0.0)
    to_other = table.translate_out(packet(UDP, PRIVATE, 5000, OTHER, 9000), 0.0)
    assert to_remote is not None and to_other is not None
    public_port = ports(to_remote)[0]
    assert ports(to_other)[0] == public_port != 5000
    assert table.translate_in(packet(UDP, REMOTE, 7000, PUBLIC, public_port), 0.0) is not None
    assert table.translate_in(packet(UDP, OTHER, 9000, PUBLIC, public_port), 0.0) is not None
    # a known address from another port, or a stranger: filtered
    assert table.translate_in(packet(UDP, REMOTE, 7001, PUBLIC, public_port), 0.0) is None
    assert table.translate_in(packet(UDP, STRANGER, 7000, PUBLIC, public_port), 0.0) is None
    # another protocol or port: no mapping
    assert table.translate_in(packet(TCP, REMOTE, 7000, PUBLIC, public_port), 0.0) is None
    assert table.translate_in(packet(UDP, REMOTE, 7000, PUBLIC, public_port ^ 1), 0.0) is None


def test_symmetric_maps_a_new_port_per_destination() -> None:
    table = nat("symmetric")
    to_remote = table.translate_out(packet(UDP, PRIVATE, 5000, REMOTE, 7000), 0.0)
    to_remote_port = table.translate_out(packet(UDP, PRIVATE, 5000, REMOTE, 7001), 0.0)
    to_other = table.translate_out(packet(UDP, PRIVATE, 5000, OTHER, 7000), 0.0)
    assert to_remote is not None and to_remote_port is not None and to_other is not None
    public_ports = {ports(p)[0] for p in (to_remote, to_remote_port, to_other)}
    assert len(public_ports) == 3
    # OTHER answering to the port REMOTE saw (what a rendezvous would hand out): filtered
    seen_by_remote = ports(to_remote)[0]
    assert table.translate_in(packet(UDP, OTHER, 7000, PUBLIC, seen_by_remote), 0.0) is None
    assert table.translate_in(packet(UDP, REMOTE, 7000, PUBLIC, seen_by_remote), 0.0) is not None
    assert {m.public_port for m in table.mappings(2, 0.0)} == public_ports


def test_mappings_expire_when_idle_and_traffic_either_way_keeps_them() -> None:
    table = nat("cone", timeout_s=10.0)
    out = table.translate_out(packet(TCP, PRIVATE, 5000, REMOTE, 80), 0.0)
    assert out is not None
    public_port = ports(out)[0]
    reply = packet(TCP, REMOTE, 80, PUBLIC, public_port)
    assert table.translate_in(reply, 9.0) is not None  # refreshed by the inbound packet
    assert table.translate_in(reply, 18.0) is not None
    [mapping] = table.mappings(2, 28.0)
    assert (mapping.protocol, mapping.private_port, mapping.idle_s) == ("tcp", 5000, 10.0)
    assert table.translate_in(reply, 28.5) is None  # idle for 10.5 s
    assert table.mappings(2, 28.5) == []  # freed
    # sending again opens a new mapping
    assert table.translate_out(packet(TCP, PRIVATE, 5000, REMOTE, 80), 30.0) is not None
    assert [m.idle_s for m in table.mappings(2, 30.0)] == [0.0]


def test_what_the_nat_does_not_translate_is_dropped() -> None:
    table = nat("cone")
    icmp = bytearray(packet(UDP, PRIVATE, 5000, REMOTE, 53))
    icmp[9] = 1
    fragment = bytearray(packet(UDP, PRIVATE, 5000, REMOTE, 53))
    fragment[6] |= 0x20  # more fragments
    truncated = packet(TCP, PRIVATE, 5000, REMOTE, 80)[:30]
    for raw in (icmp, fragment, truncated):
        assert table.translate_out(bytes(raw), 0.0) is None
        assert table.translate_in(bytes(raw), 0.0) is None
    assert table.mappings(2, 0.0) == []


def test_nat_settings_are_validated() -> None:
    assert public_peer_address(251) == "10.78.1.2"
    assert check_nat_type("cone") == "cone"
    with pytest.raises(UserError, match="none, cone, symmetric"):
        check_nat_type("full-cone")
    with pytest.raises(UserError, match="udp_s"):
        NatTimeouts(udp_s=0)


def test_nat_from_topology_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    names = ["oregon-0", "tokyo-1", "tokyo-2"]
    path.write_text(json.dumps({"nat": {"tokyo-1": "cone", "2": "symmetric"}}))
    assert nat_from_topology_file(path, names) == {1: "cone", 2: "symmetric"}
    path.write_text(json.dumps({"peers": names}))
    assert nat_from_topology_file(path, names) == {}
    for bad, message in (
        (["cone"], "nat must be an object"),
        ({"paris-9": "cone"}, "names no peer 'paris-9'"),
        ({"tokyo-1": "open"}, "nat of 'tokyo-1'"),
    ):
        path.write_text(json.dumps({"nat": bad}))
        with pytest.raises(UserError, match=message):
            nat_from_topology_file(path, names)
