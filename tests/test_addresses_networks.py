"""A private address a peer names is dialled only inside a network this machine is on (its
interface subnets and routes, net/own_networks.py), never anywhere in the private range: a node
on 192.168.1.5 was once aimed at any 10/8, 172.16/12 or CGNAT host its peers named. Pure: the
machine's networks are given, nothing is read or sent."""

from __future__ import annotations

import ipaddress

import pytest

from p2ptrain.net.address_classes import IPNetwork, may_dial


def nets(*cidrs: str) -> list[IPNetwork]:
    return [ipaddress.ip_network(cidr) for cidr in cidrs]


HOME = (["192.168.1.5"], nets("127.0.0.0/8", "192.168.1.0/24"))
VPC = (["10.0.1.5"], nets("10.0.1.0/24"))
CGNAT = (["100.64.3.4"], nets("100.64.0.0/22"))
# a testbed namespace: its TUN device's 10.77/16 and the route to the NATs' 10.78/16
TESTBED = (["10.77.0.2"], nets("127.0.0.0/8", "10.77.0.0/16", "10.78.0.0/16"))
ULA = (["fd00::2"], nets("fd00::/64", "fe80::/64"))
# a VPN's split default (0.0.0.0/1 + 128.0.0.0/1) covers all of 10/8: it is no private network
VPN = (["10.0.0.5"], nets("10.0.0.0/24", "0.0.0.0/1", "128.0.0.0/1", "::/1"))


@pytest.mark.parametrize(
    ("ip", "node", "allowed"),
    [
        ("192.168.1.9", HOME, True),  # our LAN
        ("::ffff:192.168.1.9", HOME, True),  # a dual-stack spelling of it
        ("192.168.2.9", HOME, False),  # our range, not our network
        ("::ffff:192.168.2.9", HOME, False),
        ("10.0.0.1", HOME, False),  # another range: refused before the networks count
        ("100.64.0.1", HOME, False),
        ("10.0.1.200", VPC, True),
        ("10.0.2.5", VPC, False),  # the VPC's other subnet
        ("10.200.0.1", VPC, False),
        ("100.64.1.1", CGNAT, True),
        ("100.100.1.1", CGNAT, False),  # the rest of the ISP's CGNAT block
        ("10.77.0.3", TESTBED, True),  # a peer on our TUN's subnet
        ("10.78.0.5", TESTBED, True),  # another peer's NAT, through the testbed's route
        ("10.79.0.1", TESTBED, False),
        ("fd00::9", ULA, True),
        ("fd01::9", ULA, False),  # another ULA /48: someone else's
        ("fe80::1", ULA, False),  # link-local: never, network or not
        ("10.0.0.9", VPN, True),
        ("10.5.5.5", VPN, False),  # only inside 0.0.0.0/1: no statement about 10/8
        ("8.8.8.8", VPC, True),  # global: unchanged
        ("2606:4700::1", VPC, True),
        ("127.0.0.1", VPC, False),  # loopback: only for a loopback node, as before
        ("127.0.0.1", (["127.0.0.1"], []), True),
        ("::1", (["127.0.0.1"], []), True),
        ("169.254.169.254", (["169.254.0.9"], nets("169.254.0.0/16")), False),
    ],
)
def test_private_addresses_only_inside_our_networks(
    ip: str, node: tuple[list[str], list[IPNetwork]], allowed: bool
) -> None:
    own, networks = node
    assert may_dial(ip, own, networks) is allowed


def test_an_own_address_known_only_from_our_multiaddrs_counts_as_its_own_host() -> None:
    # announced, on no interface we read (a NAT's address, a namespace we are not in)
    assert may_dial("10.77.0.2", ["10.77.0.2"], [])
    assert not may_dial("10.77.0.3", ["10.77.0.2"], [])
    assert may_dial("10.77.0.3", ["10.77.0.2"], nets("10.77.0.0/16"))  # its interface's subnet


def test_a_node_that_announces_no_private_address_dials_none() -> None:
    # the machine is on 192.168.1.0/24, but it announces a public address only: as before
    assert not may_dial("192.168.1.9", ["8.8.4.4"], nets("192.168.1.0/24"))
    assert not may_dial("192.168.1.9", [], nets("192.168.1.0/24"))


def test_unknown_networks_keep_the_range_rule() -> None:
    # where the interfaces cannot be read (not Linux): the whole range, as before
    assert may_dial("192.168.2.9", ["192.168.1.5"], None)
    assert not may_dial("10.0.0.1", ["192.168.1.5"], None)
    # known but empty: our own address only
    assert not may_dial("192.168.2.9", ["192.168.1.5"], [])
