"""A fixed-window rate limit per key (a remote IP) and in all, for the services that make us do
work for strangers: dial-backs (net/dialback.py) and UDP answers (net/nat_probe.py)."""

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
