"""This machine's networks (net/own_networks.py): the parse of the kernel's tables, the cache,
the fallback where nothing can be read, and the dial gate asking them. Given tables, except
one test that reads the real machine and checks only that the answer is sane."""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import sys

import pytest

from p2ptrain.net import own_networks
from p2ptrain.net.dial_gate import DialGate
from p2ptrain.net.own_networks import parse_if_inet6, parse_route, parse_route6


def native_hex(ip: str) -> str:
    """An IPv4 address as /proc/net/route writes it: the wire's bytes read as a native int."""
    return f"{struct.unpack('=I', socket.inet_aton(ip))[0]:08X}"


def route_line(dest: str, gateway: str, flags: int, mask: str, iface: str = "eth0") -> str:
    fields = [iface, native_hex(dest), native_hex(gateway), f"{flags:04X}", "0", "0", "0"]
    return "\t".join([*fields, native_hex(mask), "0", "0", "0"])


ROUTE = "\n".join(
    [
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT",
        route_line("0.0.0.0", "192.168.1.1", 0x3, "0.0.0.0"),  # the default: not a network
        route_line("192.168.1.0", "0.0.0.0", 0x1, "255.255.255.0"),  # the LAN
        route_line("10.78.0.0", "0.0.0.0", 0x1, "255.255.0.0", "tun0"),  # a device route
        route_line("10.20.0.0", "192.168.1.254", 0x3, "255.255.0.0"),  # through a gateway
        route_line("10.66.0.0", "0.0.0.0", 0x201, "255.255.0.0", "lo"),  # unreachable
        route_line("10.67.0.0", "0.0.0.0", 0x0, "255.255.0.0"),  # not up
        route_line("10.68.0.0", "0.0.0.0", 0x1, "255.0.255.0"),  # no valid mask
        "eth0\tnot a route",
    ]
)
ROUTE6 = """\
fd00000000000000000000000000abcd 40 00000000000000000000000000000000 00 \
00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0
fd120000000000000000000000000000 30 00000000000000000000000000000000 00 \
fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0
fd660000000000000000000000000000 30 00000000000000000000000000000000 00 \
00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
zz
"""
IF_INET6 = """\
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 04 40 00 82     eth0
fd00000000000000000000000000000x 04 40 00 82     eth0
"""


def test_ip4_routes_other_than_default_reject_and_down_are_networks() -> None:
    assert parse_route(ROUTE) == [
        ipaddress.IPv4Network("192.168.1.0/24"),
        ipaddress.IPv4Network("10.78.0.0/16"),
        ipaddress.IPv4Network("10.20.0.0/16"),
    ]


def test_ip6_routes_and_interface_prefixes() -> None:
    assert parse_route6(ROUTE6) == [
        ipaddress.IPv6Network("fd00::/64"),
        ipaddress.IPv6Network("fd12::/48"),
    ]
    assert parse_if_inet6(IF_INET6) == [
        ipaddress.IPv6Network("fe80::/64"),
        ipaddress.IPv6Network("::1/128"),
        ipaddress.IPv6Network("fd00::/64"),
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's tables")
def test_the_real_machine_reads_as_sane_networks() -> None:
    networks = own_networks.read_networks()
    assert networks is not None
    assert ipaddress.IPv4Network("127.0.0.0/8") in networks  # lo, always there
    assert all(network.prefixlen > 0 for network in networks)  # no default route
    interfaces = own_networks.ip4_interfaces()
    assert ipaddress.IPv4Interface("127.0.0.1/8") in interfaces


def test_not_linux_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert own_networks.read_networks() is None


def test_the_networks_are_cached_and_unreadable_ones_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reads: list[int] = []
    answer: tuple[ipaddress.IPv4Network, ...] | None = (ipaddress.IPv4Network("10.0.0.0/24"),)

    def read() -> tuple[ipaddress.IPv4Network, ...] | None:
        reads.append(1)
        return answer

    monkeypatch.setattr(own_networks, "read_networks", read)
    monkeypatch.setattr(own_networks, "_cache", None)
    monkeypatch.setattr(own_networks, "_said_unreadable", False)
    assert own_networks.machine_networks(lambda: 100.0) == answer
    assert own_networks.machine_networks(lambda: 100.0 + own_networks.REFRESH_S - 1) == answer
    assert len(reads) == 1
    answer = None
    with caplog.at_level(logging.WARNING, logger=own_networks.__name__):
        times = iter(100.0 + own_networks.REFRESH_S * step for step in range(2, 5))
        for _ in range(3):
            assert own_networks.machine_networks(lambda: next(times)) is None
    assert len(reads) == 4
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 1


def test_the_gate_asks_the_machines_networks() -> None:
    vpc = [ipaddress.IPv4Network("10.0.1.0/24")]
    gate = DialGate(lambda: ["/ip4/10.0.1.5/tcp/7401"], lambda: {"10.0.2.7"}, networks=lambda: vpc)
    assert gate.may_dial("/ip4/10.0.1.9/tcp/7401")  # our subnet
    assert not gate.may_dial("/ip4/10.0.2.5/tcp/22")  # the VPC's other subnet, on a peer's word
    assert gate.may_dial("/ip4/10.0.2.7/tcp/7401")  # a peer connected to us from there
    unknown = DialGate(lambda: ["/ip4/10.0.1.5/tcp/7401"], networks=lambda: None)
    assert unknown.may_dial("/ip4/10.0.2.5/tcp/7401")  # nothing read: the range rule
