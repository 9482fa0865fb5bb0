"""Rate limits. A fixed window per key (a remote IP) and in all, for the services that make us do
work for strangers: dial-backs (traversal/dialback.py) and UDP answers (traversal/nat_probe.py).
Sliding windows over stamps per key, for what a peer signs at a steady rate whatever order it
reaches us in: gossip per author and kind (control/flood.py)."""

from __future__ import annotations

import bisect
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


class StampWindows:
    """At most `limit` events per key stamped within the last `window_s` (a sliding window over
    the events' own stamps, e.g. signed timestamps, not over their arrival).

    The order of arrival does not matter: a backlog delivered at once by a stalled receiver or
    forwarder, or older messages arriving after newer ones by another path, pass as long as
    their author made them at an honest pace. Stamps count only up to `now` (stamping ahead
    of our clock earns nothing) and an event stamped before the window is refused (callers drop
    such stale events before anyway). At most `max_keys` keys are kept, the idle longest first
    to go; memory is at most limit floats a key."""

    def __init__(self, limit: int, window_s: float, max_keys: int = 4096) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._stamps: dict[str, list[float]] = {}  # key -> stamps within the window, sorted
        self.num_refused = 0

    def allow(self, key: str, now: float, stamp: float | None = None) -> bool:
        """Count one event of `key` stamped `stamp` (default `now`) at `now`; False past the
        limit."""
        stamp = now if stamp is None else min(stamp, now)
        stamps = [t for t in self._stamps.pop(key, []) if t > now - self.window_s]
        allowed = stamp > now - self.window_s and len(stamps) < self.limit
        if allowed:
            bisect.insort(stamps, stamp)
        else:
            self.num_refused += 1
        if stamps:
            self._stamps[key] = stamps  # re-inserted: the dict's order is by last use
        while len(self._stamps) > self.max_keys:
            del self._stamps[next(iter(self._stamps))]
        return allowed

    def __len__(self) -> int:
        return len(self._stamps)
