"""What a session saves of its stage, and when: the interval's saves, the state one step back
that a session's last save adds, and the plan lineage every saved state is tagged with."""

from __future__ import annotations

import torch

from p2ptrain.records import Plan, Role, RunSpec
from p2ptrain.train.model import Stage
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker.state_writer import StateWrite


def keeps_one_back(spec: RunSpec, role: Role) -> bool:
    """Must the session keep a copy of the state one step back, for its last save?"""
    # a session's end can leave a plan's stages (or its lockstep replicas) a step apart; a
    # lone stage's diloco replicas are never in lockstep: no copy of the state each step
    return role.num_stages > 1 or (spec.optim.sync == "step" and role.num_replicas > 1)


def interval_save_due(spec: RunSpec, step: int) -> bool:
    """Is step boundary `step` one of the interval's saves? Not the run's last: the session's
    end saves that one."""
    interval = spec.checkpoint.checkpoint_interval
    return bool(interval) and step % interval == 0 and step < spec.optim.steps


def stage_write(
    model: Stage,
    optimizer: torch.optim.Optimizer,
    step: int,
    outer: dict[str, torch.Tensor] | None,
    previous: StageSnapshot | None,
    plan: Plan,
) -> StateWrite:
    """The stage's state at step boundary `step`, after `previous` if that is the state one
    step back: a session's last save passes it, as the stages of a pipeline stop up to a step
    apart. The interval's saves land at one boundary on every stage: the current state is enough."""
    current = StageSnapshot.take(model, optimizer, step, outer)
    snapshots: tuple[StageSnapshot, ...] = (current,)
    if previous is not None and previous.step == step - 1:
        snapshots = (previous, current)
    # tagged with the plan's lineage; pruning keeps the newest of this lineage's and its
    # ancestors' states (train/checkpoint.py)
    rank = plan.state_rank
    return StateWrite(model, snapshots, plan.state_tag, lambda t: rank(t) is not None)
