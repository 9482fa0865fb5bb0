"""A hostile control-plane peer for tests: a raw py-libp2p host (GossipSub, Kademlia, our sync
handler) that publishes whatever it is told, signed or not. tests/control/test_bad_input.py
drives one against a node in its own trio loop; tests/redteam/control_attacker.py runs one as a
separate process against a live swarm."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.gossip import CONTROL_TOPIC, TELEMETRY_TOPIC
from p2ptrain.control.sync import SYNC_PROTOCOL
from p2ptrain.net import rpc
from p2ptrain.net.host import make_host


class Attacker:
    """A raw py-libp2p peer that can publish arbitrary bytes on our topics."""

    def __init__(self, seed: bytes, pubsub: Pubsub, host: Any) -> None:
        self.seed = seed
        self.id = identity.peer_id_of(seed)
        self.pubsub = pubsub
        self.host = host
        self.seq = wire.SeqClock()
        self.token: str | None = None  # a token in its record, as the organiser signed it

    def sees_subscriber(self, peer: str) -> bool:
        """True once peer's subscriptions reached us: our publishes (fanout) will go to it."""
        topics = self.pubsub.peer_topics
        return all(
            any(p.to_base58() == peer for p in topics.get(topic, ()))
            for topic in (CONTROL_TOPIC, TELEMETRY_TOPIC)
        )

    def envelope(self, kind: str, body: dict[str, Any], seed: bytes | None = None) -> bytes:
        """`body` signed as a `kind` message by us (or by another identity's `seed`)."""
        return wire.sign(seed or self.seed, kind, self.seq.next(), body)

    def record(self, seed: bytes | None = None, **changes: Any) -> bytes:
        """A well-formed control-only peer record of ours (or of `seed`'s identity)."""
        body: dict[str, Any] = {
            "addrs": [],
            "data_addrs": [],
            "role": "control-only",
            "planner_capable": True,
            "version": "0.1.0",
            "hardware": {},
            "compute_gflops": None,
        }
        if self.token is not None:
            body["token"] = self.token
        body.update(changes)
        return self.envelope("peer", body, seed)

    async def keep_claiming(self, term: int) -> None:
        """Behave like a live planner: re-claim the term every second."""
        while True:
            await self.publish(self.envelope("claim", {"term": term}))
            await trio.sleep(1.0)

    async def publish(self, data: bytes, topic: str = CONTROL_TOPIC) -> None:
        await self.pubsub.publish(topic, data)
        await trio.sleep(0.1)


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll state owned by another task or library (no event to wait on)."""
    with trio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.2)


@asynccontextmanager
async def open_attacker(
    victim_addrs: str | Sequence[str], seed: bytes | None = None
) -> AsyncIterator[Attacker]:
    """An attacker connected to every victim (full multiaddrs with /p2p/)."""
    seed = seed or os.urandom(32)
    host = make_host(seed)
    gossipsub = GossipSub(
        protocols=[PROTOCOL_ID_V11],
        degree=4,
        degree_low=3,
        degree_high=8,
        heartbeat_interval=1,
        spam_protection_enabled=False,
        eclipse_protection_enabled=False,
    )
    pubsub = Pubsub(host, gossipsub)
    # it speaks the DHT and sync like any peer, so the victim keeps its connection open
    dht = KadDHT(host, DHTMode.SERVER, max_peers_per_subnet=0)

    async def no_envelopes(request: bytes) -> dict[str, Any]:
        return {"envelopes": []}

    host.set_stream_handler(SYNC_PROTOCOL, rpc.make_handler(no_envelopes))
    async with (
        host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]),
        background_trio_service(dht),
        background_trio_service(pubsub),
        background_trio_service(gossipsub),
    ):
        await pubsub.wait_until_ready()
        # not subscribed: publishes go out by fanout straight to the victims, rather than
        # through a mesh a victim may prune us from (it keeps at most degree_high peers)
        for addr in [victim_addrs] if isinstance(victim_addrs, str) else victim_addrs:
            await host.connect(info_from_p2p_addr(Multiaddr(addr)))
        yield Attacker(seed, pubsub, host)
