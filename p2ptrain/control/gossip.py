"""GossipSub: our two topics, which kinds belong on each, and the validator that admits messages.

Messages are applied inside the validator (verify the envelope's header and signature, check
that the publisher is the author and the kind belongs on the topic, screen the author by its
rate and admission before the body is parsed, then Intake.apply); only a message the view
accepted is forwarded: one it refuses or ignores goes no further.
The subscriptions themselves are only drained.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.score import ScoreParams

from p2ptrain.control import wire
from p2ptrain.control.intake import Intake
from p2ptrain.control.penalties import PENALTY_BLOCK_SCORE, PENALTY_HALF_LIFE_S
from p2ptrain.control.state import NodeState
from p2ptrain.net.lazy_gossip import LazyGossipSub
from p2ptrain.net.safe_pubsub import SafePubsub

log = logging.getLogger(__name__)

CONTROL_TOPIC = "p2ptrain/control/1"  # run specs, revocations, peer records, claims, plans
TELEMETRY_TOPIC = "p2ptrain/telemetry/1"  # link-matrix rows and worker metrics
# Telemetry's audience: only the planner candidates (planner-token holders) and the bootstrap
# subscribe to TELEMETRY_TOPIC, the others publish to it through GossipSub's fanout. So a member's
# telemetry costs the swarm O(candidates) deliveries, not O(N). Everyone's telemetry goes there,
# the planner's included: a node outside the audience hears the planner alive by its claims
# (re-sent every 6 s in steady state: control/publishing.py) and the others by their records
# (at 32 peers, 3 candidates' telemetry every 2 s on CONTROL_TOPIC was 60% of what every member
# received and relayed). A planner-token holder's telemetry is still accepted on CONTROL_TOPIC
# (earlier planners sent theirs there).
TOPIC_KINDS = {
    CONTROL_TOPIC: {"run", "revoked", "peer", "claim", "plan", "telemetry"},
    TELEMETRY_TOPIC: {"telemetry"},
}

Validator = Callable[[ID, rpc_pb2.Message], bool]
# each heartbeat sends IHAVE to max(6, N/4) peers per topic: at 1 s, a 32-member swarm's
# heartbeats were a good part of each member's frames; lost messages are also healed by sync
HEARTBEAT_S = 2
MESH_DEGREE = 4  # each node relays a message to ~3 mesh peers and hears it from ~3 (bench control)
MESH_HIGH = 6  # a mesh past this is pruned back to degree 4 (docs/protocols.md, GossipSub)
PENDING_PER_PEER = 8  # messages kept for a peer whose subscription has not arrived yet
PENDING_TTL_S = 10.0  # ... and for how long (a stream's negotiation on a loaded box: up to 10 s)

# GossipSub's peer scoring carries our penalties (Intake.reject adds each one as a behaviour
# penalty, decaying with the same half-life): a peer our validators would block is also one
# whose messages GossipSub drops before validation, that we forward nothing to, that gets no
# gossip and whose GRAFTs we prune. Only the behaviour term is weighted: py-libp2p 0.8.1 checks
# a single topic's publish gate without the application-specific term, and its invalid-message
# counter would also count honest messages our validators drop as stale or ignored.
SCORE_PARAMS = ScoreParams(
    p5_behavior_penalty_weight=1.0,
    p5_behavior_penalty_threshold=0.0,
    p5_behavior_penalty_decay=0.5 ** (HEARTBEAT_S / PENALTY_HALF_LIFE_S),
    publish_threshold=-PENALTY_BLOCK_SCORE,
    gossip_threshold=-PENALTY_BLOCK_SCORE / 2,
    graylist_threshold=-PENALTY_BLOCK_SCORE,
)


def make_pubsub(host: IHost) -> tuple[Pubsub, GossipSub]:
    """Our GossipSub router and the Pubsub service over it (both still to be started)."""
    gossipsub = LazyGossipSub(  # IHAVE to fewer peers (net/lazy_gossip.py)
        # v1.1: v1.2's IDONTWANT control messages cost more CPU than they save at our sizes
        protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=MESH_DEGREE,
        degree_low=MESH_DEGREE - 1,
        # every mesh peer sends us each message once: at 8, a 9-node swarm's meshes never
        # shrank below all 8 others (8 copies of each message in, 7 out, per node)
        degree_high=MESH_HIGH,
        heartbeat_interval=HEARTBEAT_S,
        score_params=SCORE_PARAMS,
        spam_protection_enabled=False,
        adaptive_gossip_enabled=False,  # its per-heartbeat health scoring, for a fixed gossip
        eclipse_protection_enabled=False,  # all loopback peers share one IP
        # py-libp2p queues each message for every connected peer not (yet) known subscribed to
        # its topic, for a subscription about to arrive, and prunes that peer's queue on every
        # publish: every member is connected and not subscribed to TELEMETRY_TOPIC, so each
        # telemetry message the audience forwarded was queued ~30 times and each queue of 100
        # scanned (13% of a 32-peer bootstrap's profile). A short queue still covers the race.
        max_pending_messages_per_peer=PENDING_PER_PEER,
        pending_messages_ttl=PENDING_TTL_S,
    )
    # SafePubsub: a peer's garbage frame or message, or two writers on one stream, end only
    # that stream or message (net/safe_pubsub.py)
    return SafePubsub(host, gossipsub, strict_signing=True), gossipsub


async def serve_topics(
    pubsub: Pubsub,
    state: NodeState,
    intake: Intake,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Subscribe to our topics behind their validators (started once subscribed), then keep the
    subscription queues empty: the validators already applied every message."""
    async with trio.open_nursery() as nursery:
        for topic in TOPIC_KINDS if state.view.hears_telemetry else [CONTROL_TOPIC]:
            pubsub.set_topic_validator(topic, validator_for(topic, state, intake), False)
            nursery.start_soon(_drain, await pubsub.subscribe(topic))
        task_status.started()


async def _drain(subscription: Any) -> None:
    while True:
        await subscription.get()


def validator_for(topic: str, state: NodeState, intake: Intake) -> Validator:
    """The (synchronous) GossipSub validator of one topic."""
    kinds = TOPIC_KINDS[topic]

    def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
        return _validate(topic, kinds, forwarder, msg, state, intake)

    return validate


def _validate(
    topic: str,
    kinds: set[str],
    forwarder: ID,
    msg: rpc_pb2.Message,
    state: NodeState,
    intake: Intake,
) -> bool:
    """Verify, screen, decode and apply one gossip message; False drops it (and it is not
    forwarded: py-libp2p 0.8.1 forwards only what every validator passed)."""
    now = time.monotonic()
    sender = forwarder.to_base58()
    if sender == state.peer_id:
        return True  # our own publish
    if state.view.penalties.is_blocked(sender, now):
        return False
    if len(msg.data) > wire.MAX_ENVELOPE_BYTES:  # a larger plan is pulled, never gossiped
        intake.reject(sender, "oversized", f"{len(msg.data)} bytes of gossip", topic, now)
        return False
    try:
        header = wire.verified_header(msg.data)
    except wire.WireError as exc:
        if exc.category == "stale":  # no author to blame: counted against its forwarder
            intake.drop_quietly(sender, f"a late message: {exc}", topic, now)
        else:
            intake.reject(sender, exc.category, str(exc), topic, now)
        return False
    kind, author = header.kind, header.author
    if ID(msg.from_id).to_base58() != author:
        intake.reject(sender, "replayed", f"{kind} by {author} re-published by another", topic, now)
        return False
    if kind not in kinds:
        intake.reject(sender, "malformed", f"{kind} does not belong on this topic", topic, now)
        return False
    if topic == CONTROL_TOPIC and kind == "telemetry" and not state.view.may_plan(author):
        # not a candidate (now): its telemetry goes to the audience only. No penalty to the
        # author (a planner token revoked or expired a moment ago leaves an honest member here);
        # counted in its forwarder's budget of quiet drops
        intake.drop_quietly(sender, f"telemetry of {author}: no planner token", topic, now, author)
        return False
    # the author signed the pubsub message (strict signing): its rate, admission and run are
    # checked before its body is parsed
    if (drop := intake.screen(header, now)) is not None:
        intake.refuse(header, drop, sender, topic, now)
        return False
    try:
        env = wire.open_body(header)
    except wire.WireError as exc:
        intake.reject(sender, exc.category, str(exc), topic, now)
        return False
    return intake.apply(env, msg.data, sender, topic, now)
