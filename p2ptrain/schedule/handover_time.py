"""How long a stopping node's hand-over may take (control/handover.py) and its worker waits for
the plan's peers to fetch its state (worker/resume/handover.py).

A fixed part covers what any hand-over waits on (a re-plan, the start agreement, a small
state); to it comes twice the time the plan's largest stage state takes over the plan's slowest
link, as a state transfer's own deadline counts it (worker/resume/state_transfer.py). Fixed
limits alone cut off a stage of a few hundred MB over a volunteer's uplink, and the stage was
lost. The supervisor, which bounds the node's stop, learns the limit from the control process
(control/settings.py: HANDOVER_LIMIT_FILE, beside the node's IPC socket; it holds these
constants' twins, HANDOVER_LIMIT_S and MAX_HANDOVER_S, without this package's numpy).
"""

from __future__ import annotations

from p2ptrain.records import Plan, RunSpec
from p2ptrain.schedule.memory import stage_parameters

HANDOVER_BASE_S = 120.0  # from the node's "stopping" word to its exit
FETCH_BASE_S = 90.0  # the donor's worker, from its spare session's start
MAX_HANDOVER_S = 3600.0  # whatever the stage: an hour, then the node stops (a spare's copy stays)
VALUE_BYTES = 4  # fp32 on disk and on the wire


def stage_state_bytes(spec: RunSpec, layers: range) -> int:
    """A stage state's bytes: the weights and AdamW's two moments (under diloco also the
    anchor and the outer momentum)."""
    copies = 5 if spec.optim.sync == "diloco" else 3
    return copies * VALUE_BYTES * stage_parameters(spec.model_config(), layers)


def transfer_s(spec: RunSpec, plan: Plan) -> float:
    """Twice the largest stage state's time over the plan's slowest link (0: a plan made for a
    local network, or one that does not fit the model), MAX_HANDOVER_S at most: that link is
    whatever one member's link reports made it (rates down to 1 bit/s)."""
    if plan.network is None:
        return 0.0
    try:
        ranges = plan.layer_ranges(spec.model.n_layer)
    except ValueError:
        return 0.0
    largest = max((stage_state_bytes(spec, r) for r in ranges), default=0)
    return min(MAX_HANDOVER_S, 2 * largest * 8 / (plan.network.min_rate_mbps * 1e6))


def handover_limit_s(spec: RunSpec | None, plan: Plan | None) -> float:
    """The control process's limit from its "stopping" word (and how long a planner keeps a
    donor)."""
    extra = 0.0 if spec is None or plan is None else transfer_s(spec, plan)
    return min(MAX_HANDOVER_S, HANDOVER_BASE_S + extra)


def fetch_wait_s(spec: RunSpec, plan: Plan) -> float:
    """How long a donor's worker waits for the plan's peers to fetch its states."""
    return min(
        MAX_HANDOVER_S - (HANDOVER_BASE_S - FETCH_BASE_S), FETCH_BASE_S + transfer_s(spec, plan)
    )
