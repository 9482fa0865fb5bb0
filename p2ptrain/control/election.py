"""The election and planning loop: claim the planner role when the view says it is our turn and,
while we are the planner, let the PlanMaker decide on and make new plans.

The rules live elsewhere (who claims: candidacy.should_claim; when to re-plan: PlanMaker); this
loop only drives them and asks the publisher to announce a new claim or plan at once. It runs
when something it decides on changes (control/events.py: a member, a record, a health verdict,
a claim, a plan, the run) and when a deadline of its rules comes (a member's silence turning
into death, the end of the start-up grace, the planner's debounce), not on a timer; what carries
no event (link measurements, for drift and the first plan's readiness) is looked at every
ELECTION_IDLE_S.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from p2ptrain.control.candidacy import ELECTION_GRACE_S, should_claim
from p2ptrain.control.planner_sight import PlannerSight
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import SwarmView

if TYPE_CHECKING:
    from p2ptrain.control.planning.plan_maker import PlanMaker

log = logging.getLogger(__name__)

ELECTION_IDLE_S = 1.0
# A first plan is made only once our claim stood this long: at start every planner-token holder
# claims term 1 at once, and the losers hear the winner's claim within a second or two. Making
# the PlanMaker starts the planning child ahead of the first search (numpy and the scheduler,
# 50-90 MiB while it lives; before the planner's numbers moved there, it loaded numpy into the
# control process for good: 32 live peers' 2 losing candidates stayed at 116 MiB against a
# member's 95). A first plan waits for its readiness far longer anyway; a planner replacing a
# dead one (a plan stands) plans at once.
CLAIM_SETTLE_S = 5.0
_PAST_S = 1e-3  # a deadline is looked at just after it passed (is_alive's bound is inclusive)


async def serve_election(state: NodeState) -> None:
    """Run the election and, while we are the planner, the planning, once joined (members only)."""
    view, changes = state.view, state.changes
    plan_maker: PlanMaker | None = None  # made when we first plan
    claimed_at = -math.inf
    sight = PlannerSight(view)  # is a live planner blind to most of the swarm we see?
    await state.joined.wait()
    while True:
        seen = changes.count("members", "plan", "run")
        now = state.clock()
        if view.run is not None and (should_claim(view, now) or sight.takes_over(now)):
            term = view.claim()
            claimed_at = now
            log.info("claiming the planner role, term %d", term)
            state.publish_soon("claim")
        # a first plan (none stands) waits until our claim settled
        settled_at = claimed_at + CLAIM_SETTLE_S if view.plan is None else -math.inf
        if view.planner == state.peer_id and (plan_maker is not None or now >= settled_at):
            if plan_maker is None:
                plan_maker = _plan_maker(state)
            if await plan_maker.tick(
                now, state.data_addrs, state.reachability, tuple(state.relays)
            ):
                state.publish_soon("plan")
                changes.notify("plan")  # our worker link hands it over
        now = state.clock()
        wake_at = next_deadline(view, now)
        if view.planner == state.peer_id and plan_maker is None and settled_at > now:
            wake_at = min(wake_at, settled_at + _PAST_S)
        if plan_maker is not None:
            wake_at = min(wake_at, plan_maker.next_deadline(now) + _PAST_S)
        await changes.wait(("members", "plan", "run"), seen, max(wake_at - now, _PAST_S))


def _plan_maker(state: NodeState) -> PlanMaker:
    from p2ptrain.control.planning.plan_maker import PlanMaker

    return PlanMaker(state.view, state.peer_id)


def next_deadline(view: SwarmView, now: float) -> float:
    """When the view's answers change with no message: a member's silence turns into death,
    or our start-up grace (before which we never claim) ends; ELECTION_IDLE_S at most."""
    deadlines = [now + ELECTION_IDLE_S, view.started_at + ELECTION_GRACE_S + _PAST_S]
    dead_after_s = view.members.dead_after_s(now)
    deadlines += [m.last_heard + dead_after_s + _PAST_S for m in view.members.values()]
    return min((d for d in deadlines if d > now), default=math.inf)
