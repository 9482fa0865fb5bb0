"""Bringing a stage's diverged replicas back together: every replica averages the same list of
state tensors (parameters, AdamW moments, DiLoCo's anchor and outer momentum) with the others,
one verified equal-weight round per piece, in the same order (worker/averaging/stage_averager.py's
average_state: a groupmate's piece farther from ours than the drift bound is refused)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from p2ptrain.worker.averaging.stage_averager import StageAverager

log = logging.getLogger("p2ptrain.worker")

Piece = tuple[str, list[torch.Tensor], float]  # name, tensors (averaged in place), drift bound


def resync_pieces(
    averager: StageAverager, pieces: list[Piece], step: int, round_step: int | None = None
) -> bool:
    """Average every piece in place over the group (state rounds numbered 3·round_step + index,
    round_step the same on every member; `step` by default); False, with the rest left as it
    was, if a round failed."""
    number = step if round_step is None else round_step
    for index, (name, tensors, bound) in enumerate(pieces):
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu()
        averaged = averager.average_state(flat, 3 * number + index, bound)
        if averaged is None or not bool(torch.isfinite(averaged).all()):
            log.warning("step %d: replicas diverged and re-syncing failed; retrying later", step)
            return False
        if name == "exp_avg_sq":
            # Adam's second moment is >= 0, but an fp16 wire rounds the tiny deltas it is
            # averaged with: a value can come back just below 0, and its square root NaN
            averaged.clamp_(min=0.0)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                t.copy_(averaged[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
    return True
