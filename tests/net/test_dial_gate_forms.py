"""The dial gate against IPv6 forms that reach IPv4 hosts through a translator or tunnel, and
port 0 (address_classes.network_kind; net/dial_gate.py). Pure: no host, nothing is sent."""

from __future__ import annotations

import pytest

from p2ptrain.net.dial_gate import DialGate

PUBLIC_OWN = ["/ip4/203.0.113.7/tcp/7401", "/ip4/8.8.4.4/tcp/7401"]
LAN_OWN = ["/ip4/10.0.0.9/tcp/7401"]


@pytest.mark.parametrize(
    "maddr",
    [
        "/ip6/64:ff9b::a00:5/tcp/22",  # NAT64 of 10.0.0.5
        "/ip6/64:ff9b::a9fe:a9fe/tcp/80",  # NAT64 of the metadata service
        "/ip6/64:ff9b:1::a00:5/tcp/22",
        "/ip6/2002:a00:5::1/tcp/22",
        "/ip6/::a00:5/tcp/22",
        "/ip6/::ffff:0:a00:5/tcp/22",
        "/ip6/fec0::1/tcp/22",
        "/ip6/2001:0:4136:e378:8000:63bf:3fff:fdd2/tcp/22",
        "/ip4/8.8.8.8/tcp/0",  # port 0: nothing listens there
        "/ip4/8.8.8.8/tcp/00/p2p/X",
        "/ip6/2606:4700::1/udp/0/quic-v1",
        "/ip4/127.0.0.1/tcp/0",
    ],
)
def test_refused_forms(maddr: str) -> None:
    for own in (PUBLIC_OWN, LAN_OWN, ["/ip4/127.0.0.1/tcp/7401"]):
        gate = DialGate(lambda own=own: own)
        assert not gate.may_dial(maddr)
        assert gate.refusal(maddr, 0.0) == "not an address we dial"


def test_refused_forms_pass_as_seen_ips_never() -> None:
    # a peer connected from 64:ff9b::a00:5 is no evidence for dialling 10.0.0.5
    gate = DialGate(lambda: PUBLIC_OWN, seen_ips=lambda: {"64:ff9b::a00:5", "fec0::1"})
    assert not gate.may_dial("/ip6/64:ff9b::a00:5/tcp/22")
    assert not gate.may_dial("/ip6/fec0::1/tcp/22")


def test_what_still_passes() -> None:
    gate = DialGate(lambda: ["/ip4/127.0.0.1/tcp/7401", "/ip6/::1/tcp/7401"])
    assert gate.may_dial("/ip6/64:ff9b::808:808/tcp/7401")  # NAT64 of a global address
    assert gate.may_dial("/ip6/2002:808:808::1/tcp/7401")
    assert gate.may_dial("/ip4/127.0.0.1/tcp/7401") and gate.may_dial("/ip6/::1/tcp/7401")
    assert gate.may_dial("/ip4/8.8.8.8/tcp/1/p2p/X") and gate.may_dial("/ip4/8.8.8.8/tcp/65535")
    gate.trust("/ip4/192.168.0.5/tcp/7400")  # the operator's word stands
    assert gate.may_dial("/ip4/192.168.0.5/tcp/7400")
