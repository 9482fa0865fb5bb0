"""A WAN on one machine: peers in network namespaces, every packet between them through a
user-space link emulator with per-pair one-way delay, rate, jitter and loss (see docs/benchmarks.md).

Stdlib only (no torch, hivemind or libp2p): anything can drive it.
"""

from p2ptrain.testbed.handle import TestbedHandle, list_testbeds, peer_address
from p2ptrain.testbed.links import LinkSpec, LinkTable, configured_rtt_ms, links_from_topology
from p2ptrain.testbed.netns import RootRequired, require_root
from p2ptrain.testbed.testbed import Testbed, cleanup_stale

__all__ = [
    "LinkSpec",
    "LinkTable",
    "RootRequired",
    "Testbed",
    "TestbedHandle",
    "cleanup_stale",
    "configured_rtt_ms",
    "links_from_topology",
    "list_testbeds",
    "peer_address",
    "require_root",
]
