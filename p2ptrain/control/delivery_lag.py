"""How late gossip reaches us now: the extra silence a member may keep before we call it dead.

A member is alive while we heard from it within DEAD_AFTER_S (view.py). On a machine too busy to
keep up, or behind a stalled forwarder, every message arrives late (10-20 s in the soak of 16
control-only peers beside CPU burners), and a fixed bound turns that lag into deaths: members
deposed the planner in turn and the election never settled. So the bound grows by the lag we
observe: for each author, how old its latest gossip message was when it reached us (signed
timestamp against our clock); the median over the authors heard lately, so that one author with
a skewed clock or a forged old stamp moves it by nothing. Pure logic, the clock passed in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

LAG_WINDOW_S = 60.0  # authors heard within this long count
MAX_EXTRA_S = 30.0  # gossip older than this is dropped as stale anyway (wire.MAX_CLOCK_SKEW_S)
RECOMPUTE_S = 1.0  # the median is recomputed at most this often (asked per member per tick)


@dataclass
class DeliveryLag:
    _lags: dict[str, tuple[float, float]] = field(default_factory=dict)  # author -> (lag, at)
    _extra: float = 0.0
    _computed_at: float = float("-inf")

    def note(self, author: str, lag_s: float, now: float) -> None:
        """Author's message, signed `lag_s` before it reached us at `now` (a lag past
        MAX_EXTRA_S tells nothing: gossip that old is stale and dropped before it gets here)."""
        if lag_s > MAX_EXTRA_S:
            return
        self._lags.pop(author, None)  # re-inserted: the dict's order is by last heard
        self._lags[author] = (max(lag_s, 0.0), now)

    def extra_s(self, now: float) -> float:
        """The current median lag of the authors heard within LAG_WINDOW_S (0 if none)."""
        if now - self._computed_at < RECOMPUTE_S:
            return self._extra
        while self._lags:
            oldest = next(iter(self._lags))
            if now - self._lags[oldest][1] <= LAG_WINDOW_S:
                break
            del self._lags[oldest]
        self._extra = (
            statistics.median(lag for lag, _ in self._lags.values()) if self._lags else 0.0
        )
        self._computed_at = now
        return self._extra
