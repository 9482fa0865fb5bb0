"""Address classes: what a node dials on someone else's word, and when two peers' addresses
are two opinions (issue 26, findings 5 and 10). Pure: nothing is sent anywhere."""

from __future__ import annotations

import pytest

from p2ptrain.net.address_classes import (
    all_loopback,
    independence_key,
    ip_of,
    may_dial,
    network_kind,
    public_prefix,
)

LOOPBACK_NODE = ["127.0.0.1"]
LAN_NODE = ["192.168.1.20"]
PUBLIC_NODE = ["8.8.4.4"]


@pytest.mark.parametrize(
    ("ip", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.77.0.2", "10.0.0.0/8"),
        ("172.20.0.1", "172.16.0.0/12"),
        ("192.168.1.7", "192.168.0.0/16"),
        ("100.64.3.4", "100.64.0.0/10"),
        ("fd00::5", "fc00::/7"),
        ("8.8.8.8", "global"),
        ("2606:4700::1", "global"),
        ("169.254.1.1", None),
        ("fe80::1", None),
        ("224.0.0.1", None),
        ("239.1.2.3", None),
        ("ff02::1", None),
        ("0.0.0.0", None),
        ("::", None),
        ("255.255.255.255", None),
        ("240.0.0.1", None),
        ("192.0.2.1", None),
        ("2001:db8::1", None),
        ("not an ip", None),
    ],
)
def test_network_kinds(ip: str, kind: str | None) -> None:
    assert network_kind(ip) == kind


@pytest.mark.parametrize(
    ("ip", "own", "allowed"),
    [
        ("8.8.8.8", LOOPBACK_NODE, True),  # global: anyone may be dialled there
        ("8.8.8.8", PUBLIC_NODE, True),
        ("127.0.0.1", LOOPBACK_NODE, True),  # a swarm on one machine (the tests)
        ("127.0.0.1", LAN_NODE, False),  # our own machine's services: never on a peer's word
        ("127.0.0.1", PUBLIC_NODE, False),
        ("192.168.7.7", LAN_NODE, True),  # our own private network
        ("10.0.0.1", LAN_NODE, False),  # another private network: not ours
        ("10.0.0.1", PUBLIC_NODE, False),  # a public node's LAN, or its provider's
        ("10.77.0.3", ["10.78.0.1"], True),  # the testbed: one 10/8
        ("169.254.169.254", ["169.254.0.9"], False),  # link-local (a cloud's metadata): never
        ("169.254.1.1", ["10.77.0.2"], False),  # punches once counted link-local as private
        ("224.0.0.1", LAN_NODE, False),
        ("0.0.0.0", LOOPBACK_NODE, False),
        ("not an ip", LOOPBACK_NODE, False),
        ("8.8.8.8", [], True),
        ("127.0.0.1", [], False),
    ],
)
def test_may_dial(ip: str, own: list[str], allowed: bool) -> None:
    # the range rule alone: a machine whose interfaces cannot be read (test_addresses_networks.py)
    assert may_dial(ip, own, None) is allowed


def test_ip_of_reads_ip_multiaddrs_only() -> None:
    assert ip_of("/ip4/10.0.0.1/tcp/7401/p2p/12D3KooW") == "10.0.0.1"
    assert ip_of("/ip6/0:0:0:0:0:0:0:1/tcp/7401") == "::1"
    assert ip_of("/dns4/example.org/tcp/7401") is None  # a name is never an IP we may dial
    assert ip_of("/ip4/300.0.0.1/tcp/1") is None and ip_of("garbage") is None


def test_all_loopback() -> None:
    assert all_loopback(["/ip4/127.0.0.1/tcp/1/p2p/X", "/ip6/::1/tcp/2"])
    assert not all_loopback(["/ip4/127.0.0.1/tcp/1", "/ip4/10.0.0.1/tcp/1"])
    assert not all_loopback([]) and not all_loopback(["/dns4/localhost/tcp/1"])


def test_independence_keys() -> None:
    # one /24 (IPv6: /48) of global addresses is one opinion: cheap to hold many of
    assert independence_key("8.8.8.8") == independence_key("8.8.8.9") == "8.8.8.0/24"
    assert independence_key("8.8.9.8") != independence_key("8.8.8.8")
    assert independence_key("2606:4700:1::1") == independence_key("2606:4700:1:ffff::2")
    # on a private network (the testbed's 10.77/16) each address is a machine
    assert independence_key("10.77.0.1") != independence_key("10.77.0.2")
    assert independence_key("127.0.0.1") == "127.0.0.1"


def test_public_prefixes_are_the_relays_quota_keys() -> None:
    assert public_prefix("8.8.8.8") == public_prefix("8.8.8.200") == "8.8.8.0/24"
    assert public_prefix("2606:4700:1::1") == "2606:4700:1::/48"
    # loopback, a testbed's or a LAN's addresses, and what we never dial: no per-prefix quota
    for ip in ("127.0.0.1", "10.78.0.1", "192.168.1.7", "169.254.1.1", "", "not an ip"):
        assert public_prefix(ip) == ""
