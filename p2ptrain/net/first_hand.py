"""GossipSub that does not relay, on a topic whose publishers reach every subscriber themselves,
a message it got first-hand from its publisher.

A publisher outside a topic sends each message to up to `degree` of the topic's subscribers (its
fanout, topped up at each publish). While the topic has at most `degree` subscribers, that is
all of them, and whatever one of them relays arrives everywhere as a duplicate: each message of
a small audience (control/gossip.py: the planner candidates and the bootstrap hearing every
member's telemetry) cost each of its 4 nodes 3 sends and 3 duplicate receives, each framed,
encrypted, decrypted, parsed and dropped (the larger part of a candidate's CPU on 32 peers). A
message relayed to us, one from a subscribed publisher (it sends to its mesh, which may leave a
subscriber out), or one on a topic with more subscribers is forwarded as GossipSub always does;
what is not relayed stays in the message cache, so a peer that asks for it (IWANT) still gets it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2


class FirstHandGossipSub(GossipSub):
    def __init__(self, *, first_hand_topics: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first_hand_topics = frozenset(first_hand_topics)

    async def publish(self, msg_forwarder: ID, pubsub_msg: rpc_pb2.Message) -> None:
        if self._reached_everyone(msg_forwarder, pubsub_msg):
            self.mcache.put(pubsub_msg)
            return
        await super().publish(msg_forwarder, pubsub_msg)

    def _reached_everyone(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> bool:
        """Did the publisher itself send `msg` to every subscriber of its topics?"""
        pubsub = self.pubsub
        if pubsub is None or not msg.topicIDs:
            return False
        if msg_forwarder == pubsub.host.get_id() or msg_forwarder.to_bytes() != msg.from_id:
            return False  # our own message, or one relayed to us
        origin = ID(msg.from_id)
        for topic in msg.topicIDs:
            subscribers = pubsub.peer_topics.get(topic, set())
            if topic not in self.first_hand_topics or origin in subscribers:
                return False  # a subscribed publisher sends to its mesh, which may leave one out
            if len(subscribers) + 1 > self.degree:  # ourselves among them
                return False
        return True
