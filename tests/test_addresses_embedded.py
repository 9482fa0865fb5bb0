"""IPv6 forms that carry an IPv4 address (NAT64, 6to4, IPv4-compatible, SIIT) are classified as
that IPv4 address and pass only when it is global; Teredo, site-local, local-use NAT64 and the
rest of ::/8 never pass. On a network with NAT64 (a cloud's NAT gateway, 464XLAT) a record naming
64:ff9b::10.0.0.5 once made nodes dial 10.0.0.5 behind the translator. Pure: nothing is sent."""

from __future__ import annotations

import ipaddress

import pytest

from p2ptrain.net.address_classes import independence_key, may_dial, network_kind, public_prefix

PUBLIC_NODE = ["8.8.4.4"]
LAN_NODE = ["10.0.0.9"]  # a node on the very network the embedded address names
LOOPBACK_NODE = ["127.0.0.1"]
# a machine on every private network there is: a refused form is refused all the same
EVERY_NETWORK = [
    ipaddress.ip_network(net)
    for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
]

WRAPPED_PRIVATE = [
    "64:ff9b::a00:5",  # NAT64 well-known prefix (RFC 6052): 10.0.0.5
    "64:ff9b::10.0.0.5",
    "64:ff9b::a9fe:a9fe",  # 169.254.169.254: a cloud's metadata service
    "64:ff9b::7f00:1",  # 127.0.0.1 behind the translator
    "64:ff9b::c0a8:101",  # 192.168.1.1
    "64:ff9b::6440:1",  # 100.64.0.1 (carrier-grade NAT)
    "2002:a00:5::1",  # 6to4 (RFC 3056) of 10.0.0.5
    "2002:a9fe:a9fe::1",
    "2002:7f00:1::1",
    "::a00:5",  # IPv4-compatible (RFC 4291, deprecated)
    "::10.0.0.5",
    "::7f00:1",  # ::127.0.0.1 is no loopback address: refused, not loopback
    "::a9fe:a9fe",
    "::ffff:0:a00:5",  # SIIT's IPv4-translated form (RFC 6145)
    "::ffff:0:7f00:1",
    "::ffff:0:a9fe:a9fe",
]
REFUSED_RANGES = [
    "64:ff9b:1::a00:5",  # local-use NAT64 (RFC 8215)
    "64:ff9b:1:ffff::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo (RFC 4380)
    "2001::1",
    "fec0::1",  # site-local (deprecated, RFC 3879)
    "feff::1",
    "3fff::1",  # documentation (RFC 9637)
    "5f00::1",  # SRv6 segment ids (RFC 9602)
    "::2",  # the rest of ::/8
    "::100:0:0:1",
    "::",
]


@pytest.mark.parametrize("ip", WRAPPED_PRIVATE + REFUSED_RANGES)
def test_embedded_non_global_and_refused_ranges_are_never_dialled(ip: str) -> None:
    assert network_kind(ip) is None
    for own in (PUBLIC_NODE, LAN_NODE, LOOPBACK_NODE, ["fd00::1"], [ip]):
        assert not may_dial(ip, own, EVERY_NETWORK) and not may_dial(ip, own, None)
    assert public_prefix(ip) == ""


@pytest.mark.parametrize(
    ("ip", "prefix"),
    [
        ("64:ff9b::808:808", "8.8.8.0/24"),
        ("2002:808:808::1", "8.8.8.0/24"),
        ("::8.8.8.8", "8.8.8.0/24"),
        ("::ffff:0:8.8.8.8", "8.8.8.0/24"),
        ("::ffff:8.8.8.8", "8.8.8.0/24"),
    ],
)
def test_embedded_global_addresses_are_their_ip4s(ip: str, prefix: str) -> None:
    assert network_kind(ip) == "global"
    assert may_dial(ip, PUBLIC_NODE, [])
    # one host under another spelling is one opinion and one relay quota, not a new /48
    assert public_prefix(ip) == public_prefix("8.8.8.9") == prefix
    assert independence_key(ip) == independence_key("8.8.8.8")


def test_loopback_and_the_plain_forms_keep_their_kinds() -> None:
    assert network_kind("::1") == network_kind("::ffff:127.0.0.1") == "loopback"
    assert network_kind("127.0.0.1") == "loopback"
    assert may_dial("::1", LOOPBACK_NODE, []) and may_dial("127.0.0.1", ["::1"], [])
    assert network_kind("::ffff:10.0.0.5") == "10.0.0.0/8"  # a dual-stack socket's IPv4 peer
    assert may_dial("10.0.0.5", LAN_NODE, EVERY_NETWORK)
    assert not may_dial("10.0.0.5", PUBLIC_NODE, EVERY_NETWORK)
    assert network_kind("2606:4700::1") == "global"
    # next to the refused ranges: 2001:4860::/32 is no Teredo, 2003::/16 no 6to4
    assert network_kind("2001:4860::8888") == network_kind("2003::1") == "global"
    assert network_kind("64:ff9a::1") is None  # in ::/8, beside NAT64's prefix
    assert network_kind("fd00::1") == "fc00::/7"
