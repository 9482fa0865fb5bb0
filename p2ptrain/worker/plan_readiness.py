"""Whether a plan message from the control plane (or a static plan) can be trained on yet."""

from __future__ import annotations

from p2ptrain.records import PlanMessage


def why_not_actionable(message: PlanMessage, peer_id: str) -> str:
    """Why a plan message cannot be trained on yet ("" if it can)."""
    if message.run is None:
        return "no run spec"
    problem = message.plan.layer_problem(message.run.model.n_layer)
    if problem is not None:  # the control plane checks too; so do we
        return f"the plan cannot cut the model: {problem}"
    addrs = message.plan.data_addrs
    members = {p for pipeline in message.plan.pipelines for p in pipeline}
    missing = sorted(p for p in members - {peer_id} if not addrs.get(p))
    return f"no data-plane address for {', '.join(missing)}" if missing else ""
