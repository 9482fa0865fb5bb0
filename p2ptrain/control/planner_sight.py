"""Does the planner see the swarm we see? A live planner keeps its term (control/candidacy.py), so a
planner whose gossip reaches only a corner of the swarm (a late start before it heard the
others, a one-sided partition, a crippled uplink) would plan that corner, or nothing, for as
long as it lives. Its claims say how many peers it could plan for (`Claim.sees`, pool_size);
a planner candidate that sees clearly more of them (MIN_MARGIN more, and a quarter of its own
count) for BLIND_AFTER_S without a break takes the role: a higher term wins in every view.

Only more, never fewer: two planners on either side of a partition do not take the role from
each other in turn; the side that sees more keeps it. A claim that says nothing (0, a peer from
before the field) never counts as blind. What a planner says of itself only decides whether
others take its role; the role itself still needs the organiser's planner token.
"""

from __future__ import annotations

import logging

from p2ptrain.control.candidacy import ELECTION_GRACE_S
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.control.view import SwarmView

log = logging.getLogger(__name__)

# long against a planner's reaction to a change (a join is planned in ~3 s, docs/benchmarks.md)
# and against the views' honest spread, short against a run: a blind planner costs this once
BLIND_AFTER_S = 90.0
MIN_MARGIN = 3


def pool_size(view: SwarmView, now: float) -> int:
    """How many peers this view could plan for: the live, healthy members (ourselves
    included) less those that trained the run's last step, as the PlanMaker counts them."""
    trained = view.run_end.done_of(view.run)
    return sum(1 for peer in plannable_members(view, now) if peer not in trained)


def margin(seen: int) -> int:
    """How many more peers than the planner says it sees make it blind to us."""
    return max(MIN_MARGIN, seen // 4)


class PlannerSight:
    """One candidate's judgement of the planner's sight, kept across the election loop's turns."""

    def __init__(self, view: SwarmView) -> None:
        self.view = view
        self._short_since: float | None = None  # since when the planner said it sees too few
        self._watched: tuple[str, int] | None = None  # the (planner, term) it was said of

    def takes_over(self, now: float) -> bool:
        """True when we, a planner candidate, must take the role from a live planner that has
        said for BLIND_AFTER_S that it sees clearly fewer peers than we do."""
        view = self.view
        planner = view.planner
        if (
            planner is None
            or planner == view.self_id
            or view.run is None
            or view.finished
            or not view.term_anchored
            or not view.may_plan(view.self_id)
            or now - view.started_at < ELECTION_GRACE_S
            or not view.is_alive(planner, now)
        ):
            self._short_since = None
            return False
        if self._watched != (planner, view.term):
            self._watched, self._short_since = (planner, view.term), None
        sees, seen = view.planner_sees, pool_size(view, now)
        if sees <= 0 or seen < view.run.swarm.min_peers or seen - sees < margin(seen):
            self._short_since = None
            return False
        if self._short_since is None:
            self._short_since = now
            log.info("the planner %s says it sees %d peers, we see %d", planner, sees, seen)
        if now - self._short_since < BLIND_AFTER_S:
            return False
        log.warning(
            "the planner %s has seen %d peers for %.0f s where we see %d: taking the role",
            planner,
            sees,
            now - self._short_since,
            seen,
        )
        self._short_since = None
        return True
