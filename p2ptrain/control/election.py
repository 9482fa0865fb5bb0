"""The election and planning loop: claim the planner role when the view says it is our turn and,
while we are the planner, let the PlanMaker decide on and make new plans.

The rules live elsewhere (who claims: SwarmView.should_claim; when to re-plan: PlanMaker); this
loop only drives them and asks the publisher to announce a new claim or plan at once.
"""

from __future__ import annotations

import logging
import time

import trio

from p2ptrain.control.planning.plan_maker import PlanMaker
from p2ptrain.control.state import NodeState

log = logging.getLogger(__name__)

ELECTION_TICK_S = 0.5


async def serve_election(state: NodeState) -> None:
    """Run the election and, while we are the planner, the planning, once joined (members only)."""
    view = state.view
    plan_maker = PlanMaker(view, state.peer_id)
    await state.joined.wait()
    while True:
        now = time.monotonic()
        if view.run is not None and view.should_claim(now):
            term = view.claim()
            log.info("claiming the planner role, term %d", term)
            state.publish_soon("claim")
        if view.planner == state.peer_id and await plan_maker.tick(
            now, state.data_addrs, state.reachability, tuple(state.relays)
        ):
            state.publish_soon("plan")
        await trio.sleep(ELECTION_TICK_S)
