"""What a plan asks of this peer: which stage of which replica, and who its neighbours are.

Pure (no torch, no network): plans arrive as JSON (contracts.md) and are checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2ptrain.errors import UserError


@dataclass(frozen=True)
class Role:
    epoch: int
    stage: int
    num_stages: int
    replica: int
    num_replicas: int
    prev_peer: str | None  # sends us activations, receives our gradients
    next_peer: str | None  # receives our activations, sends us gradients
    stage_peers: tuple[str, ...]  # everyone holding our stage, one per replica

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1


def check_plan(plan: Any) -> None:
    """Raise UserError unless `plan` is a well-formed plan body."""
    if not isinstance(plan, dict):
        raise UserError("plan must be an object")
    stages, pipelines = plan.get("stages"), plan.get("pipelines")
    if not isinstance(stages, int) or stages < 1:
        raise UserError("plan.stages must be a positive integer")
    if not isinstance(plan.get("epoch"), int):
        raise UserError("plan.epoch must be an integer")
    if not isinstance(pipelines, list) or not pipelines:
        raise UserError("plan.pipelines must be a non-empty list")
    seen: set[str] = set()
    for pipeline in pipelines:
        if not isinstance(pipeline, list) or len(pipeline) != stages:
            raise UserError("every pipeline must list exactly `stages` peers")
        for peer in pipeline:
            if not isinstance(peer, str) or peer in seen:
                raise UserError(f"peer {peer!r} is not a string or appears twice")
            seen.add(peer)
    addrs = plan.get("data_addrs", {})
    if not isinstance(addrs, dict) or not all(
        isinstance(a, list) and all(isinstance(x, str) for x in a) for a in addrs.values()
    ):
        raise UserError("plan.data_addrs must map peer ids to lists of multiaddrs")


def role_in_plan(plan: dict[str, Any], peer_id: str) -> Role | None:
    """This peer's role, or None if the plan leaves it out (a spare)."""
    check_plan(plan)
    pipelines: list[list[str]] = plan["pipelines"]
    for replica, pipeline in enumerate(pipelines):
        if peer_id in pipeline:
            stage = pipeline.index(peer_id)
            return Role(
                epoch=plan["epoch"],
                stage=stage,
                num_stages=plan["stages"],
                replica=replica,
                num_replicas=len(pipelines),
                prev_peer=pipeline[stage - 1] if stage > 0 else None,
                next_peer=pipeline[stage + 1] if stage + 1 < len(pipeline) else None,
                stage_peers=tuple(p[stage] for p in pipelines),
            )
    return None
