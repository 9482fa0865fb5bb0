"""A stage's replicas kept together, as a session sees them: the averager a plan calls for, each
step's gradient round over it or DiLoCo's outer rounds, and the re-sync of parameters and AdamW
moments that drifted apart (worker/averaging/ holds the rounds themselves; StageReplicas is what
a session holds of them, worker/session.py decides when to call it)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from hivemind import DHT

from p2ptrain.records import MetricsReport, Plan, Role, RunSpec
from p2ptrain.train.model import Stage, token_row_spans
from p2ptrain.worker.averaging.outer_group import stage_exchanges
from p2ptrain.worker.averaging.outer_rounds import OuterRounds, RoundReport
from p2ptrain.worker.averaging.robust import MOMENTS_DRIFT_BOUND, PARAMS_DRIFT_BOUND
from p2ptrain.worker.averaging.stage_averager import Outcome, StageAverager
from p2ptrain.worker.dht_helpers import swarm_prefix
from p2ptrain.worker.faults import NO_FAULTS, Faults
from p2ptrain.worker.pipeline import stage_step
from p2ptrain.worker.pipeline.transport import Transport
from p2ptrain.worker.profiler import StepProfiler
from p2ptrain.worker.resume.resync import Piece, resync_pieces

log = logging.getLogger("p2ptrain.worker")


class StageReplicas:
    """What one session holds of its stage's replicas (open_replicas): the averager of every
    step's gradients, or the outer rounds of sync = "diloco", and what the last step's round did.
    Without either (a lone replica, a spare) every step is "solo"."""

    def __init__(
        self,
        averager: StageAverager | None = None,
        outer: OuterRounds | None = None,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.averager = averager
        self.outer = outer
        self.faults = faults
        self.group_size = 1  # how many replicas the last step's gradient was averaged over
        self.wire_cpu: tuple[float, float] | None = None  # its round's parts' CPU marks
        self._resync_params = False  # the last step's replicas started it apart
        self.outer_round: RoundReport | None = None  # what the step's outer round did

    def average_gradients(
        self, model: Stage, role: Role, step: int, should_stop: Callable[[], bool]
    ) -> str:
        """Replace this stage's gradients by their verified average over replicas; the outcome."""
        self.group_size, self.wire_cpu = 1, None
        if self.averager is None or self.outer is not None:  # diloco: outer rounds instead
            return "solo"
        if self.faults.before_averaging(step, role.stage, role.replica):
            return "local"
        outcome = average_gradients(model, self.averager, step, should_stop)
        self._resync_params = outcome.diverged
        self.group_size, self.wire_cpu = outcome.group_size, outcome.wire_cpu
        return outcome.kind

    def resync_if_diverged(self, model: Stage, optimizer: torch.optim.Optimizer, step: int) -> None:
        """After the update: the replicas started this step from different parameters."""
        if self._resync_params:
            assert self.averager is not None
            resync_replicas(model, optimizer, self.averager, step)

    def outer_round_if_due(self, step: int, should_stop: Callable[[], bool]) -> None:
        """sync = "diloco": start or apply the stage's outer round (worker/averaging/outer_rounds.py)."""
        self.outer_round = None
        if self.outer is not None:
            self.outer_round = self.outer.after_step(step, should_stop)

    def outer_state(self) -> dict[str, torch.Tensor] | None:
        return None if self.outer is None else self.outer.state_tensors()

    def reported(self, metrics: MetricsReport) -> MetricsReport:
        """The step's metrics, with the outer rounds for the progress line if there are any."""
        if self.outer is None:
            return metrics
        return self.outer.reported(metrics, self.outer_round)

    def end_rounds(self) -> None:
        """A round still running ends (stop or timeout): before the session's last save."""
        if self.outer is not None:
            self.outer.close()

    def close(self) -> None:
        """Leave the averaging swarm; nothing of the replicas is held after this."""
        if self.averager is not None:
            self.averager.close()
        self.averager = self.outer = None


def open_averager(
    spec: RunSpec,
    plan: Plan,
    role: Role,
    dht: DHT,
    transport: Transport,
    model: Stage,
    profiler: StepProfiler,
) -> StageAverager | None:
    """The averager over the stage's replicas, None when the plan gives it only one."""
    if role.num_replicas <= 1:
        return None
    num_params = sum(p.numel() for p in model.parameters())
    return StageAverager(
        dht,
        num_params,
        swarm_prefix(spec.run_id, role.stage, role.epoch, plan.term),
        role.num_replicas,
        spec.wire.compression,
        spec.wire.averaging_timeout_s,
        # each replica's weight is its rows of the step's data, as the plan fixes them
        group=stage_step.replica_weights(spec, role),
        network=plan.network,
        stage=role.stage,
        traffic=transport.traffic,
        wire=profiler.wire_marks(),
        token_rows=token_row_spans(model),
    )


def open_replicas(
    spec: RunSpec,
    plan: Plan,
    role: Role,
    dht: DHT,
    transport: Transport,
    model: Stage,
    profiler: StepProfiler,
    faults: Faults = NO_FAULTS,
) -> StageReplicas:
    """What keeps the stage's replicas together: sync = "step", the averager of every step's
    gradients; sync = "diloco", the outer rounds over our own exchange, with an averager
    opened only if the group's anchors ever need a re-sync. hivemind forks the averager's
    process from the worker: every page the passes then write is copied once (copy on write),
    which made a fresh session's first steps 1.4-1.9x the median (bench scaleout)."""

    def opened() -> StageAverager | None:
        return open_averager(spec, plan, role, dht, transport, model, profiler)

    if spec.optim.sync != "diloco":
        return StageReplicas(opened(), faults=faults)

    def skips_round(step: int) -> bool:  # the faults' hook as a round starts (tests only)
        return faults.before_averaging(step, role.stage, role.replica)

    outer = OuterRounds(spec, role.stage, role.num_stages, model, opened, skips_round=skips_round)
    outer.exchanges = stage_exchanges(spec, role, plan, transport, model)
    return StageReplicas(outer=outer, faults=faults)


def average_gradients(
    model: Stage, averager: StageAverager, step: int, should_stop: Callable[[], bool]
) -> Outcome:
    """Replace the stage's gradients, in place, by their verified average over its replicas."""
    params = [p for p in model.parameters() if p.grad is not None]
    # hivemind averages CPU tensors: one copy off the device each way
    flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]).cpu()
    flat_params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    averaged, outcome = averager.average(flat, step, should_stop, flat_params)
    offset = 0
    for p in params:
        assert p.grad is not None
        p.grad.copy_(averaged[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    return outcome


def resync_replicas(
    model: Stage, optimizer: torch.optim.Optimizer, averager: StageAverager, step: int
) -> bool:
    """The group saw its replicas start a step from different parameters (a replica once
    applied a local-only update): all of them average their parameters and AdamW moments
    now, together, in the same order. False if a round failed (retried at a later step)."""
    params = list(model.parameters())
    pieces: list[Piece] = [("params", list(params), PARAMS_DRIFT_BOUND)]
    for name in ("exp_avg", "exp_avg_sq"):
        moments = [optimizer.state.get(p, {}).get(name) for p in params]
        if all(isinstance(m, torch.Tensor) for m in moments):
            tensors = [m for m in moments if m is not None]
            pieces.append((name, tensors, MOMENTS_DRIFT_BOUND))
    if not resync_pieces(averager, pieces, step):
        return False
    log.info("step %d: replicas had diverged: parameters re-synced", step)
    return True
