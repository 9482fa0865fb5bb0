"""Rate limits. A fixed window per key (a remote IP) and in all, for the services that make us do
work for strangers: dial-backs (traversal/dialback.py) and UDP answers (traversal/nat_probe.py).
Sliding windows over stamps per key, for what a peer signs at a steady rate whatever order it
reaches us in: gossip per author and kind (control/flood.py). Token buckets per peer and for all
strangers, for how fast inbound streams may be opened (StreamRates, net/rpc.py's InboundLimits).

StreamRates: the caps on open streams bound what is held at once, not how often: a peer that
opens a stream, asks, and opens the next had a sync page built, a plan served or a probe
answered as fast as our loop could, for as long as it liked. A burst, then a steady rate; a
stream past its bucket is refused unread like one past the caps. Honest peers open a handful a
second at most (a sync round's pages and named pulls, a status, a probe), far below
PEER_RATE_PER_S; a joining swarm's strangers (joiners sync and pull plans before they are
admitted) share STRANGERS_RATE_PER_S, and a refused stream is retried by the next round."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass


class WindowLimiter:
    """At most `per_key` events per key and `total` in all per window of `window_s`; the
    counters restart with each window, so memory stays within `total` keys."""

    def __init__(self, per_key: int, total: int, window_s: float) -> None:
        self.per_key = per_key
        self.total = total
        self.window_s = window_s
        self._window_start = float("-inf")
        self._counts: Counter[str] = Counter()
        self._num_events = 0
        self.num_refused = 0

    def allow(self, key: str, now: float) -> bool:
        """Count one event for `key` at `now` (monotonic seconds) if the limits allow it."""
        if now - self._window_start >= self.window_s:
            self._window_start = now
            self._counts.clear()
            self._num_events = 0
        if self._num_events >= self.total or self._counts[key] >= self.per_key:
            self.num_refused += 1
            return False
        self._counts[key] += 1
        self._num_events += 1
        return True


class StampWindows:
    """At most `limit` events per key stamped within the last `window_s` (a sliding window over
    the events' own stamps, e.g. signed timestamps, not over their arrival).

    The order of arrival does not matter: a backlog delivered at once by a stalled receiver or
    forwarder, or older messages arriving after newer ones by another path, pass as long as
    their author made them at an honest pace. Stamps count only up to `now` (stamping ahead
    of our clock earns nothing) and an event stamped before the window is refused (callers drop
    such stale events before anyway). An event named (`event`: e.g. a message's signed sequence
    number) counts once: its copies, however many peers replay it, pass uncounted. At most
    `max_keys` keys are kept, the idle longest first to go; memory is at most limit stamps and
    events a key."""

    def __init__(self, limit: int, window_s: float, max_keys: int = 4096) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._stamps: dict[str, list[float]] = {}  # key -> stamps within the window, sorted
        self._events: dict[str, dict[Hashable, float]] = {}  # key -> named events counted
        self.num_refused = 0

    def allow(
        self, key: str, now: float, stamp: float | None = None, event: Hashable | None = None
    ) -> bool:
        """Count one event of `key` stamped `stamp` (default `now`) at `now`; False past the
        limit. A named `event` counted already within the window passes uncounted."""
        stamp = now if stamp is None else min(stamp, now)
        start = now - self.window_s
        stamps = [t for t in self._stamps.pop(key, []) if t > start]
        events = {e: t for e, t in self._events.pop(key, {}).items() if t > start}
        if event is not None and event in events:
            allowed = True
        else:
            allowed = stamp > start and len(stamps) < self.limit
            if allowed:
                bisect.insort(stamps, stamp)
                if event is not None:
                    events[event] = stamp
            else:
                self.num_refused += 1
        if stamps:
            self._stamps[key] = stamps  # re-inserted: the dict's order is by last use
        if events:
            self._events[key] = events
        while len(self._stamps) > self.max_keys:
            oldest = next(iter(self._stamps))
            del self._stamps[oldest]
            self._events.pop(oldest, None)
        return allowed

    def __len__(self) -> int:
        return len(self._stamps)


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
