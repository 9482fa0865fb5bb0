"""Confirming a plan made on estimated links (a swarm past FULL_MESH_PEERS members: the planner's
matrix is mostly predicted, control/estimate/matrix.py).

The plan's own links are then measured first by their ends (plan partners lead the neighbour set:
control/measuring.py). Once they are, or after CONFIRM_WAIT_S, the plan is priced on what was
measured; a plan REPLAN_IF_WORSE dearer than predicted is re-made, on the measured links (the
planner's drift path: it switches only if the new placement pays, planner.SWITCH_GAIN). At most
MAX_CONFIRM_ROUNDS confirmations (so one re-plan fewer) in a row for one membership, as bench
control confirms: each new plan brings newly estimated links to confirm, and on noisy
measurements (32 peers on one loaded machine) every confirmation priced the plan dearer, a
re-plan every ~20 s. Pure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from p2ptrain.control.estimate.book import is_full_mesh, plan_links
from p2ptrain.control.estimate.matrix import EstimatedMatrices
from p2ptrain.control.planning import planner
from p2ptrain.records import Plan, RunSpec

log = logging.getLogger(__name__)

CONFIRM_WAIT_S = 30.0
REPLAN_IF_WORSE = 1.10
MAX_CONFIRM_ROUNDS = 3


class PlanConfirmation:
    """The estimated links of the planner's latest plan, until they are confirmed."""

    def __init__(self) -> None:
        self.unconfirmed: set[tuple[str, str]] = set()
        self._planned_at = 0.0
        self._members: frozenset[str] = frozenset()
        self._rounds = 0  # confirmation re-plans in a row for these members

    def note(
        self, estimated: EstimatedMatrices, pipelines: Sequence[Sequence[str]], now: float
    ) -> None:
        """A new plan of `pipelines`, made on `estimated`: remember its estimated links (none
        in a swarm that measures every link: its plans are re-made on drift, as before)."""
        index = {p: i for i, p in enumerate(estimated.matrices.peers)}
        self._planned_at, self.unconfirmed = now, set()
        if frozenset(index) != self._members:
            self._members, self._rounds = frozenset(index), 0
        if is_full_mesh(len(index)) or self._rounds >= MAX_CONFIRM_ROUNDS - 1:
            return
        self.unconfirmed = {
            (a, b)
            for a, b in plan_links(pipelines)
            if a in index and b in index and not estimated.rtt_measured[index[a], index[b]]
        }

    def worse(
        self, now: float, plan: Plan | None, estimated: EstimatedMatrices, run: RunSpec
    ) -> bool:
        """Once the plan's estimated links are measured in `estimated` (or CONFIRM_WAIT_S
        passed): does `plan`, priced on them, cost over REPLAN_IF_WORSE times its prediction?
        Answered once per plan (False while waiting)."""
        if not self.unconfirmed or plan is None:
            return False
        index = {p: i for i, p in enumerate(estimated.matrices.peers)}

        def measured(a: str, b: str) -> bool:
            i, j = index.get(a), index.get(b)
            if i is None or j is None:
                return True  # a member left: the membership re-plans it
            return bool(estimated.rtt_measured[i, j] and estimated.rate_measured[i, j])

        waiting = [pair for pair in self.unconfirmed if not measured(*pair)]
        if waiting and now - self._planned_at < CONFIRM_WAIT_S:
            return False
        self.unconfirmed = set()
        layers = plan.stage_layers
        cost_s = planner.placement_cost(estimated.matrices, plan.pipelines, run, layers)
        if cost_s is None:
            return False
        worse = cost_s > REPLAN_IF_WORSE * plan.cost_s
        self._rounds += worse
        log.info(
            "plan term %d epoch %d priced on its measured links (%d still estimated): %.3f s "
            "per step vs %.3f s predicted%s",
            plan.term,
            plan.epoch,
            len(waiting),
            cost_s,
            plan.cost_s,
            ": re-planning" if worse else "",
        )
        return worse
