"""GossipSub's per-peer state ends with the peer: a stranger's GRAFT and PRUNE change nothing,
and the heartbeat and dead-peer handling forget departed peers (net/lazy_gossip.py,
net/safe_pubsub.py). Unit tests on the router, and real hosts on loopback in one trio loop."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any

import trio
from libp2p import new_host
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils import encode_varint_prefixed
from multiaddr import Multiaddr

from p2ptrain.control.gossip import make_pubsub
from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.net.lazy_gossip import LazyGossipSub
from tests.net.trio_run import run

TOPIC = "t"
LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
FOREVER = 10**9  # the back-off a stranger asks for, in seconds


def peer(i: int) -> ID:
    return ID(i.to_bytes(4, "big") * 8)


LIVE, GHOST = peer(1), peer(2)


def router_with(peers: dict[ID, Any]) -> LazyGossipSub:
    """Our router over a stand-in pubsub whose registered peers are `peers`, none connected."""
    _, gossipsub = make_pubsub(new_host())
    assert isinstance(gossipsub, LazyGossipSub)
    gossipsub.pubsub = SimpleNamespace(  # type: ignore[assignment]
        peers=peers, peer_topics={}, _peer_is_connected=lambda _peer: False
    )
    gossipsub.mesh = {TOPIC: set()}
    return gossipsub


def prune(topic: str) -> rpc_pb2.ControlPrune:
    return rpc_pb2.ControlPrune(topicID=topic, backoff=FOREVER)


def test_a_stranger_can_neither_graft_nor_leave_back_offs() -> None:
    router = router_with({LIVE: None})

    async def control() -> None:
        await router.handle_graft(rpc_pb2.ControlGraft(topicID=TOPIC), GHOST)
        await router.handle_prune(prune(TOPIC), GHOST)
        await router.handle_prune(prune("any name"), LIVE)
        await router.handle_graft(rpc_pb2.ControlGraft(topicID=TOPIC), LIVE)

    run(control)
    assert router.mesh[TOPIC] == {LIVE}
    assert router.back_off == {}
    assert router.scorer is not None and GHOST not in router.scorer.behavior_penalty


def test_a_pubsub_peer_still_prunes_a_topic_of_our_mesh() -> None:
    router = router_with({LIVE: None})
    router.mesh[TOPIC].add(LIVE)

    async def control() -> None:
        await router.handle_prune(prune(TOPIC), LIVE)

    run(control)
    assert router.mesh[TOPIC] == set()
    assert router.back_off[TOPIC][LIVE] > time.time() + 60


def test_a_heartbeat_forgets_departed_peers_and_expired_back_offs() -> None:
    """The library's heartbeat calls mesh_heartbeat first; what it left behind is gone."""
    router = router_with({LIVE: None})
    router.mesh[TOPIC] |= {LIVE, GHOST}
    router.fanout = {"f": {LIVE, GHOST}}
    assert router.scorer is not None
    router.scorer.on_join_mesh(GHOST, TOPIC)
    router.scorer.penalize_behavior(GHOST)
    now = int(time.time())
    router.back_off = {TOPIC: {LIVE: now - 1, GHOST: now + FOREVER}, "x": {LIVE: now + 60}}
    router.recent_message_deliveries[TOPIC].extend([time.time()] * 5)

    router.mesh_heartbeat()

    assert router.mesh[TOPIC] == {LIVE} and router.fanout["f"] == {LIVE}
    assert GHOST not in router.scorer.time_in_mesh
    assert GHOST not in router.scorer.behavior_penalty
    assert router.back_off == {"x": {LIVE: now + 60}}
    assert not router.recent_message_deliveries


def test_a_dead_peer_that_never_registered_leaves_the_mesh() -> None:
    pubsub, router = make_pubsub(new_host())
    router.mesh = {TOPIC: {GHOST}}
    assert router.scorer is not None
    router.scorer.on_join_mesh(GHOST, TOPIC)
    pubsub._handle_dead_peer(GHOST)
    assert router.mesh[TOPIC] == set()
    assert GHOST not in router.scorer.time_in_mesh


def test_a_stranger_that_grafts_and_leaves_leaves_nothing() -> None:
    """The audit's attack: a host without pubsub opens /meshsub, subscribes, GRAFTs our topic and
    PRUNEs random ones with an endless back-off, then disconnects. An honest peer's GRAFT still
    counts."""

    async def scenario() -> tuple[set[ID], int, bool, bool]:
        node, stranger, honest = (make_host(os.urandom(32)) for _ in range(3))
        pubsub, router = make_pubsub(node)
        honest_pubsub, honest_router = make_pubsub(honest)
        async with (
            node.run(listen_addrs=LISTEN),
            stranger.run(listen_addrs=LISTEN),
            honest.run(listen_addrs=LISTEN),
            background_trio_service(pubsub),
            background_trio_service(router),
            background_trio_service(honest_pubsub),
            background_trio_service(honest_router),
        ):
            await pubsub.wait_until_ready()
            await honest_pubsub.wait_until_ready()
            await pubsub.subscribe(TOPIC)
            await honest_pubsub.subscribe(TOPIC)
            info = info_from_p2p_addr(Multiaddr(full_addrs(node)[0]))
            with trio.fail_after(10):
                await attack(stranger, info, pubsub)
                await until(lambda: not pubsub._peer_is_connected(stranger.get_id()))
                await honest.connect(info)
                await until(lambda: honest.get_id() in router.mesh[TOPIC])
            await trio.sleep(0.2)  # the dead-peer handling
            assert router.scorer is not None
            ghost = stranger.get_id()
            return (
                router.mesh[TOPIC],
                sum(len(entries) for entries in router.back_off.values()),
                ghost in router.scorer.time_in_mesh,
                honest.get_id() in router.mesh[TOPIC],
            )

    mesh, back_offs, scored, honest_in_mesh = run(scenario)
    assert len(mesh) == 1 and honest_in_mesh
    assert back_offs == 0
    assert not scored


async def attack(stranger: Any, info: Any, pubsub: Any) -> None:
    """Subscribe, GRAFT and PRUNE 20 random topics in one RPC; a second RPC marks the first as
    handled (one stream's RPCs are read in order), then disconnect."""
    await stranger.connect(info)
    stream = await stranger.new_stream(info.peer_id, [TProtocol("/meshsub/1.1.0")])
    rpc = rpc_pb2.RPC()
    rpc.subscriptions.add(subscribe=True, topicid=TOPIC)
    rpc.control.graft.add(topicID=TOPIC)
    for _ in range(20):
        rpc.control.prune.add(topicID=os.urandom(8).hex(), backoff=FOREVER)
    marker = rpc_pb2.RPC()
    marker.subscriptions.add(subscribe=True, topicid="marker")
    for message in (rpc, marker):
        await stream.write(encode_varint_prefixed(message.SerializeToString()))
    await until(lambda: stranger.get_id() in pubsub.peer_topics.get("marker", ()))
    for conn in list(stranger.get_network().get_connections()):
        await conn.close()


async def until(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110 - pubsub's tables have no event to wait on
        await trio.sleep(0.05)
