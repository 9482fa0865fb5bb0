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

    def __init__(self, rate_per_s: float, burst: float, max_keys: int = 4096) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self.num_refused = 0

    def allow(self, key: str, now: float) -> bool:
        """Take one token from `key`'s bucket at `now` (monotonic seconds), if it has one."""
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate_per_s)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        else:
            self.num_refused += 1
        self._buckets[key] = (tokens, now)  # re-inserted: the dict's order is by last use
        while len(self._buckets) > self.max_keys:
            del self._buckets[next(iter(self._buckets))]
        return allowed

    def __len__(self) -> int:
        return len(self._buckets)
