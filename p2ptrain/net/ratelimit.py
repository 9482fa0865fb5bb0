"""Rate limits. A fixed window per key (a remote IP) and in all, for the services that make us do
work for strangers: dial-backs (net/dialback.py) and UDP answers (net/nat_probe.py). Token
buckets per key, for what a peer may send at a steady rate: gossip per author and kind
(control/flood.py)."""

from __future__ import annotations

from collections import Counter


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


class TokenBuckets:
    """A token bucket per key: up to `burst` events at once, refilled at `rate_per_s`. At most
    `max_keys` buckets are kept: the one unused longest goes first (it has most likely refilled,
    and a bucket that has refilled is the same as none)."""

    def __init__(
        self, rate_per_s: float, burst: float, max_keys: int = 4096, backlog_s: float = 0.0
    ) -> None:
        """backlog_s: how far back (by stamp) a new key's first events may reach and still
        refill its bucket (at least burst/rate_per_s)."""
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self.backlog_s = max(backlog_s, burst / rate_per_s)
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self.num_refused = 0

    def allow(self, key: str, now: float, stamp: float | None = None) -> bool:
        """Take one token from `key`'s bucket at `now`, if it has one.

        stamp: the time the event says it was made (a signed timestamp; `now` on the same clock).
        The bucket then refills by the stamps' progress, not by arrival: a backlog of events made
        at an honest pace, delivered together by a stalled receiver or forwarder, passes whole.
        Stamps count only up to `now`, so a sender gains no token by stamping ahead of our
        clock, and a new key's bucket starts at most backlog_s seconds in the past: a sender
        that stamps its first events further back gains nothing by it."""
        paced = now if stamp is None else min(stamp, now)
        fresh = (self.burst, max(paced, now - self.backlog_s))
        tokens, at = self._buckets.pop(key, fresh)
        tokens = min(self.burst, tokens + max(0.0, paced - at) * self.rate_per_s)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        else:
            self.num_refused += 1
        # re-inserted: the dict's order is by last use
        self._buckets[key] = (tokens, max(at, paced))
        while len(self._buckets) > self.max_keys:
            del self._buckets[next(iter(self._buckets))]
        return allowed

    def __len__(self) -> int:
        return len(self._buckets)
