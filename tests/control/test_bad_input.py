"""Bad input reaches a live control node over real GossipSub; each kind is dropped with a log line,
the sender is penalised, and the node keeps working. Hosts share one trio loop on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.node import (
    CONTROL_TOPIC,
    STATUS_PROTOCOL,
    TELEMETRY_TOPIC,
    ControlNode,
    NodeConfig,
)
from p2ptrain.net import rpc
from p2ptrain.net.host import make_host
from p2ptrain.runspec import RunSpec


class Attacker:
    """A raw py-libp2p peer that can publish arbitrary bytes on our topics."""

    def __init__(self, seed: bytes, pubsub: Pubsub, host) -> None:
        self.seed = seed
        self.id = identity.peer_id_of(seed)
        self.pubsub = pubsub
        self.host = host
        self.seq = wire.SeqClock()

    def envelope(self, kind: str, body: dict) -> bytes:
        return wire.encode(self.seed, kind, self.seq.next(), body)

    def record(self) -> bytes:
        body = {
            "addrs": [],
            "data_addrs": [],
            "role": "control-only",
            "planner_capable": True,
            "version": "0.1.0",
            "hardware": {},
            "compute_gflops": None,
        }
        return self.envelope("peer", body)

    async def publish(self, data: bytes, topic: str = CONTROL_TOPIC) -> None:
        await self.pubsub.publish(topic, data)
        await trio.sleep(0.1)


@asynccontextmanager
async def open_attacker(victim_addr: str) -> AsyncIterator[Attacker]:
    seed = os.urandom(32)
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
    async with (
        host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]),
        background_trio_service(pubsub),
        background_trio_service(gossipsub),
    ):
        await pubsub.wait_until_ready()
        for topic in (CONTROL_TOPIC, TELEMETRY_TOPIC):
            await pubsub.subscribe(topic)
        await host.connect(info_from_p2p_addr(Multiaddr(victim_addr)))
        yield Attacker(seed, pubsub, host)


def test_bad_messages_are_dropped_logged_and_penalised(caplog):
    caplog.set_level(logging.WARNING, logger="p2ptrain")
    results: dict[str, object] = {}

    async def scenario() -> None:
        victim = ControlNode(
            NodeConfig(seed=os.urandom(32), role="bootstrap", run=RunSpec(), print_addr=False)
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(victim.run)
            addr = victim.addrs[0]
            async with (
                open_attacker(addr) as malformed,
                open_attacker(addr) as oversized,
                open_attacker(addr) as unsigned,
                open_attacker(addr) as forger,
                open_attacker(addr) as replayer,
                open_attacker(addr) as rogue_planner,
                open_attacker(addr) as spammer,
                open_attacker(addr) as planner_peer,
            ):
                await trio.sleep(2.5)  # subscriptions exchanged, meshes grafted
                await malformed.publish(b"{not json")
                await oversized.publish(b"{" + b" " * (wire.MAX_ENVELOPE_BYTES + 10) + b"}")
                stripped = json.loads(unsigned.record())
                del stripped["sig"]
                await unsigned.publish(json.dumps(stripped).encode())
                # signed by the forger, in the name of another peer
                forged = json.loads(forger.record())
                forged["author"] = identity.peer_id_of(os.urandom(32))
                await forger.publish(json.dumps(forged).encode())
                original = replayer.record()
                await replayer.publish(original)
                await replayer.publish(original)
                # an honest-looking planner is followed first; then a peer that never claimed
                # the term publishes a plan for it
                await planner_peer.publish(planner_peer.record())
                await trio.sleep(0.3)
                await planner_peer.publish(planner_peer.envelope("claim", {"term": 1}))
                await rogue_planner.publish(rogue_planner.record())
                plan = {
                    "term": 1,
                    "epoch": 1,
                    "planner": rogue_planner.id,
                    "stages": 1,
                    "pipelines": [[rogue_planner.id]],
                    "spares": [],
                    "data_addrs": {},
                    "cost_s": 0.1,
                }
                await rogue_planner.publish(rogue_planner.envelope("plan", plan))
                for _ in range(3):
                    await spammer.publish(b"\x00garbage", TELEMETRY_TOPIC)
                await trio.sleep(1.0)
                results["penalties"] = {
                    name: victim.view.penalty_score(a.id)
                    for name, a in [
                        ("malformed", malformed),
                        ("oversized", oversized),
                        ("unsigned", unsigned),
                        ("forged", forger),
                        ("replayed", replayer),
                        ("non-planner", rogue_planner),
                        ("spammer", spammer),
                    ]
                }
                results["blocked"] = {
                    a.id
                    for a in (spammer, forger)
                    if victim.view.is_blocked(a.id, time.monotonic())
                }
                results["ids"] = {
                    "spammer": spammer.id,
                    "forger": forger.id,
                    "planner": planner_peer.id,
                }
                results["planner"] = victim.view.planner
                results["plan"] = victim.view.plan
                results["replayer_is_member"] = replayer.id in victim.view.members
                # the victim still works: it answers status
                results["status"] = await rpc.call(
                    replayer.host, ID.from_base58(victim.peer_id), STATUS_PROTOCOL
                )
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    penalties = results["penalties"]
    assert isinstance(penalties, dict)
    assert all(score > 0 for score in penalties.values()), penalties
    ids = results["ids"]
    assert isinstance(ids, dict)
    assert results["blocked"] == {ids["spammer"], ids["forger"]}
    assert results["plan"] is None  # the rogue plan was not accepted
    assert results["planner"] == results["ids"]["planner"]
    assert results["replayer_is_member"]  # the original record was accepted, the replay dropped
    status = results["status"]
    assert isinstance(status, dict) and status["observed_by"]
    log_text = caplog.text
    for category in ("malformed", "oversized", "unsigned", "forged", "replayed", "non-planner"):
        assert f"dropped {category} message" in log_text, category
    assert "blocking" in log_text
