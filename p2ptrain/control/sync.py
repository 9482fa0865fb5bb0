"""Pull anti-entropy over SYNC_PROTOCOL: every few seconds, fetch a random live peer's latest
signed envelopes and apply those we lack. It heals what gossip lost, even for a node whose mesh
broke. The server answers with what we author and the latest we accepted from each other author.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2ptrain.control import wire
from p2ptrain.control.intake import Intake
from p2ptrain.control.publishing import authored_messages
from p2ptrain.control.state import NodeState
from p2ptrain.net import rpc

log = logging.getLogger(__name__)

SYNC_PROTOCOL = TProtocol("/p2ptrain/sync/1.0.0")
SYNC_INTERVAL_S = 5.0
MAX_SYNC_ENVELOPES = 4096
# records before what depends on them (telemetry and claims need the author's record)
KIND_ORDER = {"run": 0, "peer": 1, "claim": 2, "plan": 3, "telemetry": 4}


class PullSync:
    """Both ends of the sync protocol for one node."""

    def __init__(self, state: NodeState, intake: Intake) -> None:
        self.state = state
        self.intake = intake

    async def serve_sync(self) -> None:
        """Once joined, sync from a random connected live member (or the bootstrap), forever."""
        state = self.state
        await state.joined.wait()
        while True:
            live = set(state.view.live_members(time.monotonic())) | {state.view.bootstrap_id}
            candidates = [
                p for p in (c.to_base58() for c in state.host.get_connected_peers()) if p in live
            ]
            if candidates:
                await self.sync_from(random.choice(candidates))
            await trio.sleep(SYNC_INTERVAL_S * random.uniform(0.8, 1.2))

    async def sync_from(self, peer: str) -> None:
        """Fetch `peer`'s envelopes and apply the ones we lack; blame it for bad ones."""
        state = self.state
        try:
            reply = await rpc.call(state.host, ID.from_base58(peer), SYNC_PROTOCOL)
            envelopes = reply["envelopes"]
            if not isinstance(envelopes, list):
                raise TypeError("envelopes must be a list")
        except Exception as exc:
            log.debug("sync from %s failed: %s", peer, exc)
            return
        for text in envelopes[:MAX_SYNC_ENVELOPES]:
            now = time.monotonic()
            if state.view.is_blocked(peer, now) or not isinstance(text, str):
                return
            data = text.encode()
            try:
                env = wire.decode(data)
            except wire.WireError as exc:
                if exc.category != "stale":
                    self.intake.reject(peer, exc.category, str(exc), "sync", now)
                continue
            if env.author != state.peer_id and not state.view.knows(env):
                self.intake.apply(env, data, peer, "sync", now)

    async def respond_sync(self, request: bytes) -> dict[str, Any]:
        """The server side: a fresh copy of our own messages, then those we hold of others."""
        own = authored_messages(self.state)
        latest = self.state.latest
        held = [latest[key] for key in sorted(latest, key=lambda key: KIND_ORDER[key[1]])]
        return {"envelopes": [d.decode() for d in [*own, *held]]}
