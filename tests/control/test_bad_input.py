"""Bad input reaches a live control node over real GossipSub; each kind is dropped with a log line,
the sender is penalised, and the node keeps working. Hosts share one trio loop on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import time

import trio
from libp2p.peer.id import ID

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.gossip import CONTROL_TOPIC, TELEMETRY_TOPIC
from p2ptrain.control.node import ControlNode, NodeConfig
from p2ptrain.control.rpcs import STATUS_PROTOCOL
from p2ptrain.control.sync import SYNC_PROTOCOL
from p2ptrain.net import rpc
from p2ptrain.records import RunSpec, issue_token
from tests.control.attacker import Attacker, open_attacker, wait_until


def test_bad_messages_are_dropped_logged_and_penalised(caplog):
    caplog.set_level(logging.WARNING, logger="p2ptrain")
    results: dict[str, object] = {}

    async def scenario() -> None:
        organiser = os.urandom(32)
        victim = ControlNode(
            NodeConfig(seed=organiser, role="bootstrap", run=RunSpec(), print_addr=False)
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
                open_attacker(addr) as sync_server,
            ):
                attackers = [
                    malformed,
                    oversized,
                    unsigned,
                    forger,
                    replayer,
                    rogue_planner,
                    spammer,
                    planner_peer,
                    sync_server,
                ]
                # until each attacker knows the victim's subscriptions
                await wait_until(lambda: all(a.sees_subscriber(victim.peer_id) for a in attackers))

                async def until_blamed(
                    attacker: Attacker, data: bytes, topic: str = CONTROL_TOPIC
                ) -> None:
                    """Publish until the victim blames the attacker (gossip may drop a
                    message on a loaded machine; each retry is a new gossip message)."""
                    for _ in range(10):
                        await attacker.publish(data, topic)
                        with trio.move_on_after(3):
                            await wait_until(lambda: victim.view.penalties.score(attacker.id) > 0)
                            return

                await until_blamed(malformed, b"{not json")
                await until_blamed(oversized, b"{" + b" " * (wire.MAX_ENVELOPE_BYTES + 10) + b"}")
                stripped = json.loads(unsigned.record())
                del stripped["sig"]
                await until_blamed(unsigned, json.dumps(stripped).encode())
                # signed by the forger, in the name of another peer
                forged = json.loads(forger.record())
                forged["author"] = identity.peer_id_of(os.urandom(32))
                await until_blamed(forger, json.dumps(forged).encode())
                # a replay: another peer's signed envelope re-published as the replayer's own
                await until_blamed(replayer, planner_peer.record())
                # an honest-looking planner is followed first; then a peer that never claimed
                # the term publishes a plan for it
                # the honest planner holds the organiser's planner token
                planner_peer.token = issue_token(organiser, planner_peer.id, True, 2e9).encode()
                await planner_peer.publish(planner_peer.record())
                await wait_until(lambda: planner_peer.id in victim.view.members)
                async with trio.open_nursery() as claims:
                    claims.start_soon(planner_peer.keep_claiming, 1)
                    await wait_until(lambda: victim.view.planner == planner_peer.id)
                    await rogue_planner.publish(rogue_planner.record())
                    await wait_until(lambda: rogue_planner.id in victim.view.members)
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
                    await until_blamed(rogue_planner, rogue_planner.envelope("plan", plan))
                    claims.cancel_scope.cancel()
                with trio.move_on_after(20):  # garbage until blocked
                    while not victim.view.penalties.is_blocked(spammer.id, time.monotonic()):
                        await spammer.publish(b"\x00garbage", TELEMETRY_TOPIC)
                        await trio.sleep(0.4)
                # pull anti-entropy: a peer serving forged and malformed envelopes is blamed too
                forged_sync = json.loads(sync_server.record())
                forged_sync["body"]["role"] = "bootstrap"  # changed after signing
                bad_envelopes = [json.dumps(forged_sync), "{oops", 7]

                async def serve_sync(request: bytes) -> dict:
                    return {"envelopes": bad_envelopes}

                sync_server.host.set_stream_handler(SYNC_PROTOCOL, rpc.make_handler(serve_sync))
                await victim.sync.sync_from(sync_server.id)
                results["sync_penalty"] = victim.view.penalties.score(sync_server.id)
                results["penalties"] = {
                    name: victim.view.penalties.score(a.id)
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
                # GossipSub's peer scoring carries the penalties: the blocked spammer is below
                # the publish gate, so its messages are dropped before any validator runs
                scorer = victim.gossipsub.scorer
                assert scorer is not None
                results["spammer_allowed"] = scorer.allow_publish(
                    ID.from_base58(spammer.id), [TELEMETRY_TOPIC]
                )
                results["honest_allowed"] = scorer.allow_publish(
                    ID.from_base58(planner_peer.id), [CONTROL_TOPIC]
                )
                results["blocked"] = {
                    a.id
                    for a in (spammer, forger)
                    if victim.view.penalties.is_blocked(a.id, time.monotonic())
                }
                results["ids"] = {
                    "spammer": spammer.id,
                    "forger": forger.id,
                    "planner": planner_peer.id,
                }
                results["planner"] = victim.view.planner
                results["plan"] = victim.view.plan
                # the victim still works: it answers status
                results["status"] = await rpc.call(
                    replayer.host, ID.from_base58(victim.peer_id), STATUS_PROTOCOL
                )
            nursery.cancel_scope.cancel()

    try:
        trio.run(scenario)
    except* RuntimeError as group:  # py-libp2p's teardown race, after the results are in
        if not all("Nursery is closed" in str(e) for e in group.exceptions):
            raise
    penalties = results["penalties"]
    assert isinstance(penalties, dict)
    assert all(score > 0 for score in penalties.values()), str(penalties)
    ids = results["ids"]
    assert isinstance(ids, dict)
    assert results["blocked"] == {ids["spammer"], ids["forger"]}
    assert results["spammer_allowed"] is False and results["honest_allowed"] is True
    assert results["plan"] is None  # the rogue plan was not accepted
    assert results["planner"] == results["ids"]["planner"]
    status = results["status"]
    assert isinstance(status, dict) and status["observed_by"]
    log_text = caplog.text
    for category in ("malformed", "oversized", "unsigned", "forged", "replayed", "non-planner"):
        assert f"dropped {category} message" in log_text, category
    assert "blocking" in log_text
    assert results["sync_penalty"] >= 10  # forged (10) + malformed (5), halving over 30 s
    assert "dropped forged message on sync" in log_text
