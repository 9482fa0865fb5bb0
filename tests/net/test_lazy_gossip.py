"""A heartbeat's IHAVE goes to max(3, a tenth of) a topic's non-mesh peers, not py-libp2p's
hard-wired max(6, a quarter of) them (net/lazy_gossip.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2

from p2ptrain.control.gossip import make_pubsub
from p2ptrain.net.lazy_gossip import LazyGossipSub, gossip_peers

TOPIC = "t"


def peer(i: int) -> ID:
    return ID(i.to_bytes(4, "big") * 8)


@pytest.mark.parametrize(("others", "expected"), [(0, 3), (28, 3), (96, 9), (996, 99)])
def test_the_gossip_fan_grows_with_a_tenth_of_the_others(others: int, expected: int) -> None:
    assert gossip_peers(others) == expected


@pytest.mark.parametrize("others", [28, 96])
def test_a_heartbeat_sends_ihave_to_that_many_peers(others: int) -> None:
    """The library's own heartbeat, over our count: the override is the one it calls."""
    router = LazyGossipSub(protocols=[PROTOCOL_ID_V11], degree=4, degree_low=3, degree_high=6)
    peers = {peer(i) for i in range(others + 4)}
    mesh = set(sorted(peers, key=lambda p: p.to_bytes())[:4])
    router.pubsub = SimpleNamespace(peer_topics={TOPIC: peers})  # type: ignore[assignment]
    router.peer_protocol = dict.fromkeys(peers, PROTOCOL_ID_V11)
    router.mesh = {TOPIC: mesh}
    msg = rpc_pb2.Message(data=b"x", topicIDs=[TOPIC], seqno=b"\x00" * 8, from_id=b"a")
    router.mcache.put(msg)
    gossip: dict[Any, Any] = router.gossip_heartbeat()
    assert len(gossip) == gossip_peers(others)
    assert not set(gossip) & mesh
    assert len(gossip) < max(6, others // 4)  # py-libp2p's own count


def test_the_control_plane_uses_it() -> None:
    from libp2p import new_host

    _, router = make_pubsub(new_host())
    assert isinstance(router, LazyGossipSub)
