"""A small audience does not relay to itself what each of its members got first-hand from the
publisher (net/first_hand.py). Real hosts on loopback in one trio loop: a publisher outside the
topic and three subscribers, all connected."""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2ptrain.net.first_hand import FirstHandGossipSub
from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.net.safe_pubsub import SafePubsub
from tests.net.trio_run import run

TOPIC = "t"
PAYLOAD = b"telemetry of one member"


class _CountingPubsub(SafePubsub):
    """Counts the messages it writes that carry PAYLOAD (its own and relayed ones)."""

    sent = 0

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        self.sent += sum(msg.data == PAYLOAD for msg in rpc_msg.publish)
        return await super().write_msg(stream, rpc_msg)


def _pubsub(host: Any, first_hand: tuple[str, ...]) -> _CountingPubsub:
    router = FirstHandGossipSub(
        first_hand_topics=first_hand,
        protocols=[PROTOCOL_ID_V11],
        degree=4,
        degree_low=3,
        degree_high=6,
        heartbeat_interval=1,
    )
    return _CountingPubsub(host, router, strict_signing=True)


async def _sends_of_one_message(first_hand: tuple[str, ...]) -> tuple[int, list[int]]:
    """(copies of one published message written in all, copies each subscriber received)."""
    hosts = [make_host(os.urandom(32)) for _ in range(4)]
    listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
    async with contextlib.AsyncExitStack() as stack:
        for host in hosts:
            await stack.enter_async_context(host.run(listen_addrs=listen))
        pubsubs = [_pubsub(host, first_hand) for host in hosts]
        for pubsub in pubsubs:  # before the connections: pubsub greets each new peer
            await stack.enter_async_context(background_trio_service(pubsub))
            await stack.enter_async_context(background_trio_service(pubsub.router))
            await pubsub.wait_until_ready()
        for i, host in enumerate(hosts):
            for other in hosts[i + 1 :]:
                await host.connect(info_from_p2p_addr(Multiaddr(full_addrs(other)[0])))
        publisher, *audience = pubsubs
        subscriptions = [await pubsub.subscribe(TOPIC) for pubsub in audience]
        for _ in range(200):  # each knows the others subscribed (the publisher: 3, each: 2)
            if all(len(p.peer_topics.get(TOPIC, ())) >= 2 + (p is publisher) for p in pubsubs):
                break
            await trio.sleep(0.1)
        await trio.sleep(2.5)  # heartbeats: the audience's meshes graft
        await publisher.publish(TOPIC, PAYLOAD)
        received = []
        for subscription in subscriptions:
            with trio.fail_after(10):
                assert (await subscription.get()).data == PAYLOAD
            received.append(1)
        await trio.sleep(1.0)  # what relays there are have arrived
        return sum(p.sent for p in pubsubs), received


def test_first_hand_copies_are_not_relayed_and_everyone_still_hears() -> None:
    sent, received = run(lambda: _sends_of_one_message((TOPIC,)))
    assert received == [1, 1, 1]
    assert sent == 3  # the publisher's three, nothing relayed


def test_without_it_the_audience_relays_to_itself() -> None:
    sent, received = run(lambda: _sends_of_one_message(()))
    assert received == [1, 1, 1]
    assert sent > 3


def _router(peers_subscribed: int, topics: tuple[str, ...] = (TOPIC,)) -> FirstHandGossipSub:
    router = FirstHandGossipSub(
        first_hand_topics=topics, protocols=[PROTOCOL_ID_V11], degree=4, degree_low=3, degree_high=6
    )
    me, others = ID(b"\x00me"), {ID(bytes([i, 1])) for i in range(peers_subscribed)}
    host = SimpleNamespace(get_id=lambda: me)
    router.pubsub = SimpleNamespace(host=host, peer_topics={TOPIC: others})  # type: ignore[assignment]
    return router


def _message(origin: ID, topic: str = TOPIC) -> rpc_pb2.Message:
    return rpc_pb2.Message(data=b"x", topicIDs=[topic], from_id=origin.to_bytes(), seqno=b"1")


@pytest.mark.parametrize(
    ("subscribed", "first_hand", "reached"),
    [
        (3, True, True),  # 3 others + us = degree: the publisher's fanout was all of us
        (4, True, False),  # 4 others + us: some subscriber may have been left out
        (3, False, False),  # relayed to us: pass it on
    ],
)
def test_only_a_first_hand_message_of_a_small_audience_stays(
    subscribed: int, first_hand: bool, reached: bool
) -> None:
    router = _router(subscribed)
    origin, relay = ID(b"\x07origin"), ID(b"\x08relay")
    msg = _message(origin)
    assert router._reached_everyone(origin if first_hand else relay, msg) is reached


def test_other_topics_our_own_and_subscribed_publishers_messages_are_forwarded() -> None:
    router = _router(1)
    origin = ID(b"\x07origin")
    assert not router._reached_everyone(origin, _message(origin, "other"))
    assert router.pubsub is not None
    router.pubsub.peer_topics[TOPIC].add(origin)  # a publisher in the topic: its mesh decides
    assert not router._reached_everyone(origin, _message(origin))
    assert router.pubsub is not None
    me = router.pubsub.host.get_id()
    assert not router._reached_everyone(me, _message(me))
