"""A WAN on one machine: peers in network namespaces, every packet between them through a
user-space link emulator with per-pair one-way delay, rate, jitter and loss, and optionally an
emulated NAT in front of a peer (see docs/benchmarks.md).

Stdlib only (no torch, hivemind or libp2p): anything can drive it.
"""

from p2ptrain.testbed.handle import TestbedHandle, list_testbeds, peer_address
from p2ptrain.testbed.links import LinkSpec, LinkTable, configured_rtt_ms, links_from_topology
from p2ptrain.testbed.nat import NAT_TYPES, NatMapping, NatTimeouts, public_peer_address
from p2ptrain.testbed.netns import RootRequired, require_root
from p2ptrain.testbed.testbed import Testbed, cleanup_stale

__all__ = [
    "NAT_TYPES",
    "LinkSpec",
    "LinkTable",
    "NatMapping",
    "NatTimeouts",
    "RootRequired",
    "Testbed",
    "TestbedHandle",
    "cleanup_stale",
    "configured_rtt_ms",
    "links_from_topology",
    "list_testbeds",
    "peer_address",
    "public_peer_address",
    "require_root",
]
