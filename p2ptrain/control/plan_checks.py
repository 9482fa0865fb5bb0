"""A plan from our planner, checked before any worker sees it: against the run spec (a shape the
model cannot take is the planner's fault) and the membership (a peer we have no record of yet is
a difference of views: dropped quietly, the planner re-sends)."""

from __future__ import annotations

from p2ptrain.control.drop import Drop
from p2ptrain.control.membership import Membership
from p2ptrain.records import MEMBER_ROLES, Plan, RunSpec


def plan_problem(
    plan: Plan, run: RunSpec | None, members: Membership, own: str | None
) -> Drop | None:
    """Why `plan` is refused, or None. `own`: our own peer id if we are a member ourselves."""
    if run is not None and plan.stages > min(run.swarm.stages, run.model.n_layer):
        return Drop(
            f"plan of {plan.stages} stages for a run of {run.swarm.stages} stages and "
            f"{run.model.n_layer} layers",
            "malformed",
        )
    if run is not None and (problem := plan.layer_problem(run.model.n_layer)) is not None:
        return Drop(f"plan does not fit the run's model: {problem}", "malformed")
    for peer in plan.peers():
        member = members.get(peer)
        if peer != own and (member is None or member.record.role not in MEMBER_ROLES):
            return Drop(f"plan names {peer}, which is not a member we know")
    return None
