"""Verified envelopes into the SwarmView, from gossip and from sync alike: apply, keep or blame.

An envelope the view accepts from another author is kept in NodeState.latest for sync clients;
one it refuses as hostile costs its culprit a penalty (SwarmView.penalise) and a log warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from p2ptrain.control import wire
from p2ptrain.control.penalties import BLOCK_S, PENALTIES
from p2ptrain.control.state import NodeState

log = logging.getLogger(__name__)


class Intake:
    """The one way a decoded envelope reaches the view; `via` names the topic or "sync"."""

    def __init__(
        self, state: NodeState, on_penalty: Callable[[str, float], None] | None = None
    ) -> None:
        """on_penalty(peer, amount): told of every penalty too (GossipSub's peer scoring)."""
        self.state = state
        self._on_penalty = on_penalty
        self._blocked_logged: set[str] = set()  # blocked peers whose blocking was logged

    def apply(self, env: wire.Envelope, data: bytes, sender: str, via: str, now: float) -> bool:
        """Feed a verified envelope to the view; keep it for sync if accepted; blame if hostile."""
        # gossip arrives as it is sent; sync hands over the latest envelope it holds, which
        # may be old: it proves its author alive only as of when it was signed
        heard_at = (
            None
            if via != "sync"
            else now - min(max(0.0, time.time() - env.ts), wire.MAX_CLOCK_SKEW_S)
        )
        drop = self.state.view.accept(env, now, heard_at)
        if drop is None:
            if env.author != self.state.peer_id:
                self.state.latest[(env.author, env.kind)] = data
            return True
        if drop.category is None:
            log.debug("ignored %s from %s: %s", env.kind, env.author, drop.reason)
            return True
        culprit = sender if drop.category == "replayed" else env.author
        self.reject(culprit, drop.category, drop.reason, via, now)
        return False

    def reject(self, peer: str, category: str, reason: str, via: str, now: float) -> None:
        """Penalise `peer` for a bad message and log it (and its blocking, once per block)."""
        view = self.state.view
        # forget blocks that ran out, so a peer blocked again is logged again
        self._blocked_logged = {p for p in self._blocked_logged if view.is_blocked(p, now)}
        score = view.penalise(peer, category, now)
        if self._on_penalty is not None:
            self._on_penalty(peer, PENALTIES[category])
        log.warning(
            "dropped %s message on %s from %s: %s (penalty %.1f)",
            category,
            via,
            peer,
            reason,
            score,
        )
        if view.is_blocked(peer, now) and peer not in self._blocked_logged:
            # our validators drop everything it sends or writes; pubsub's own blacklist is not
            # used: its teardown can crash the pubsub service (py-libp2p 0.8.1)
            log.warning("blocking %s for %.0f s", peer, BLOCK_S)
            self._blocked_logged.add(peer)
