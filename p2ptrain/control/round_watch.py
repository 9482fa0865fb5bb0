"""Is our worker's outer round (sync = "diloco") filling our links? Pure, clock passed in.

A round sends a stage's pseudo-gradient to its groupmates: for the seconds it runs, the links
it crosses are full and our probes on them queue, time out or get a share of the rate. Those
are the round's own traffic, not the link: priced as the link, they re-planned a diloco run
mid-run (bench scaleout, 2026-11-25: the current plan priced 3x its cost). So a probe result
that overlapped one of our rounds (or its ROUND_GRACE_S tail, while the queues drain) is set
aside, as long as the link has a recent counted value of that kind (control/links.py,
LinkTable.counts_probe): a link that really slows shows in the probes between rounds,
and where rounds leave no room for any, in the probes past the hold.

The worker tells us through its step metrics (records/messages.py, `outer_round`): "started"
after the step that starts a round, an outcome after the step that applies it (or a plan's
new session, whose rounds start afresh). A round never reported as ended stops counting after
MAX_ROUND_S (a worker that died in one).
"""

from __future__ import annotations

import math

ROUND_GRACE_S = 1.0  # after a round ends: the queues drain, a groupmate sends its last bytes
MAX_ROUND_S = 120.0  # a round not reported as ended by then counts as over


class RoundWatch:
    """Our worker's outer rounds, as its metrics report them."""

    def __init__(self) -> None:
        self._started_at: float | None = None  # the round in flight (None: none)
        self._plan: tuple[int, int] | None = None  # the plan the round runs under
        self._ended_at = -math.inf

    def note(self, plan: tuple[int, int], outer_round: str, now: float) -> None:
        """One step's metrics: under `plan` (term, epoch), its outer round ("" none, "started",
        or what the applied round did)."""
        self._expire(now)
        if self._started_at is not None and (outer_round or plan != self._plan):
            self._started_at, self._ended_at = None, now  # applied, failed, or a new session
        if outer_round == "started":
            self._started_at, self._plan = now, plan

    def in_round(self, now: float) -> bool:
        self._expire(now)
        return self._started_at is not None

    def disturbed(self, since: float, now: float) -> bool:
        """Did a round of ours (or its grace) overlap the span [since, now]?"""
        return self.in_round(now) or self._ended_at + ROUND_GRACE_S >= since

    def _expire(self, now: float) -> None:
        if self._started_at is not None and now - self._started_at > MAX_ROUND_S:
            self._ended_at = self._started_at + MAX_ROUND_S
            self._started_at = None
