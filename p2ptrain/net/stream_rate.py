"""How fast one peer, and all strangers together, may open inbound streams (net/rpc.py's
InboundLimits). The caps on open streams bound what is held at once, not how often: a peer
that opens a stream, asks, and opens the next had a sync page built, a plan served or a probe
answered as fast as our loop could, for as long as it liked. Token buckets: a burst, then a
steady rate; a stream past its bucket is refused unread like one past the caps.

Honest peers open a handful a second at most (a sync round's pages and named pulls, a status, a
probe), far below PEER_RATE_PER_S; a joining swarm's strangers (joiners sync and pull plans
before they are admitted) share STRANGERS_RATE_PER_S, and a refused stream is retried by the
next round. Stdlib only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

PEER_RATE_PER_S = 20.0
# a status of a large swarm is up to 64 pages read back to back (control/observer.py)
PEER_BURST = 100.0
STRANGERS_RATE_PER_S = 100.0  # every non-member together
STRANGERS_BURST = 200.0
MAX_TRACKED_PEERS = 4096  # buckets kept; an idle one is full again, the same as none


@dataclass
class TokenBucket:
    rate_per_s: float
    burst: float
    tokens: float
    at: float

    def take(self, now: float) -> bool:
        """Spend one token if there is one (refilled at `rate_per_s` up to `burst` since the
        last call)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_s)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.at) * self.rate_per_s >= self.burst


class StreamRates:
    """One bucket per remote peer and one for all strangers: `allows(peer, stranger)` is False
    for a stream opened past either."""

    def __init__(
        self,
        rate_per_s: float = PEER_RATE_PER_S,
        burst: float = PEER_BURST,
        strangers_rate_per_s: float = STRANGERS_RATE_PER_S,
        strangers_burst: float = STRANGERS_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s, self.burst, self.clock = rate_per_s, burst, clock
        self._peers: dict[str, TokenBucket] = {}
        self._strangers = TokenBucket(
            strangers_rate_per_s, strangers_burst, strangers_burst, clock()
        )

    def allows(self, peer: str, stranger: bool) -> bool:
        now = self.clock()
        bucket = self._peers.get(peer)
        if bucket is None:
            self._make_room(now)
            bucket = self._peers[peer] = TokenBucket(self.rate_per_s, self.burst, self.burst, now)
        # the peer's own bucket first: a flooding stranger does not drain the strangers' share
        return bucket.take(now) and (not stranger or self._strangers.take(now))

    def _make_room(self, now: float) -> None:
        """Keep at most MAX_TRACKED_PEERS buckets: drop the full ones (a full bucket is what a
        peer without one gets), else the oldest (throwaway identities: the strangers' bucket
        still holds them all back)."""
        if len(self._peers) < MAX_TRACKED_PEERS:
            return
        for peer in [p for p, b in self._peers.items() if b.full(now)]:
            del self._peers[peer]
        while len(self._peers) > MAX_TRACKED_PEERS * 3 // 4:  # room for many: one scan each
            del self._peers[next(iter(self._peers))]
