"""How long our own event loop stood still lately: silence that is ours, not the members'.

A member is alive while we heard from it within DEAD_AFTER_S plus the delivery lag
(control/delivery_lag.py). That lag is measured on the messages we process; a node whose own
process gets no CPU for seconds (a 2-core box carrying 8 training peers: bench scaleout,
2026-11-26) processes nothing meanwhile, and when it runs again its ticks may come before the
backlog waiting in its sockets. Then every member looks silent at once: a planner published a
plan of itself alone, and a member claimed a new term while the planner was well. So a heartbeat
task sleeps TICK_S at a time and notes how much later than asked it woke; a member's allowed
silence grows by the longest such stall in the last STALL_WINDOW_S, and by the stall in progress
(the time since the last heartbeat beyond TICK_S), so a check that runs before the heartbeat
after a stall is covered too. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import deque

TICK_S = 0.5  # the heartbeat's sleep
STALL_WINDOW_S = 60.0  # a stall widens liveness for this long after it
MAX_EXTRA_S = 30.0  # past this, a silence is a death whoever stalled
MIN_STALL_S = 0.2  # oversleeping by less is ordinary scheduling
LOGGED_STALL_S = 2.0  # a stall this long is worth a line: the others may have missed us


class LoopStall:
    """The heartbeat's record of the loop's stalls (seconds past TICK_S, with when)."""

    def __init__(self) -> None:
        self._last_beat: float | None = None
        self._stalls: deque[tuple[float, float]] = deque()  # (ended at, seconds)

    def beat(self, now: float) -> float:
        """The heartbeat woke at `now` (it asked to sleep TICK_S after its last beat); returns
        the stall it ended (0: none)."""
        stall = 0.0
        if self._last_beat is not None:
            stall = now - self._last_beat - TICK_S
            if stall >= MIN_STALL_S:
                self._stalls.append((now, stall))
        self._last_beat = now
        return stall if stall >= MIN_STALL_S else 0.0

    def extra_s(self, now: float) -> float:
        """The longest stall within STALL_WINDOW_S, or the one in progress (0 without beats)."""
        while self._stalls and now - self._stalls[0][0] > STALL_WINDOW_S:
            self._stalls.popleft()
        longest = max((seconds for _, seconds in self._stalls), default=0.0)
        if self._last_beat is not None:
            longest = max(longest, now - self._last_beat - TICK_S)
        return min(max(longest, 0.0), MAX_EXTRA_S)
