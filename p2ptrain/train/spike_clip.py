"""A member's own spike clip (run spec `spike_clip`): before its stage's gradient goes into a
round, a replica clips it to `factor` × the median of that stage's last WINDOW gradient norms of
its own.

Why: on 8 rows a replica, one replica's batch now and then yields a gradient 3-8× the other's
in every stage (docs/benchmarks.md, "Honest pairs, replayed"), and a group of two cannot tell
that from a liar: its rules fail the round. Each honest member clipping its own spikes keeps
honest pairs inside those rules, and leaves the rules on what a liar sends as they are (a liar
skips its clip and is bounded as before). Each member judges only its own history, so nothing a
groupmate says moves its bound.

The one-process reference trainer has no replicas to clip apart: with `spike_clip` set, a swarm
no longer reproduces it exactly once a clip bites (as with compressed exchange).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import torch
from torch import nn

WINDOW = 16  # the norms a bound is the median of
WARMUP = 4  # no clip before this many norms are known


class SpikeClip:
    """One stage's clip; `factor` 0 is off (clip() then does nothing)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self._norms: deque[float] = deque(maxlen=WINDOW)
        self.clipped = 0  # gradients clipped so far

    def clip(self, model: nn.Module) -> float | None:
        """Clip `model`'s gradients in place if their norm is a spike; the scale applied, or
        None if none was. A spike enters the history at its bound, so it does not raise the
        next bound; a non-finite norm is left to the step's finite check and not recorded."""
        if self.factor <= 0:
            return None
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return None
        norms = [torch.linalg.vector_norm(g.detach(), dtype=torch.float32) for g in grads]
        norm = float(torch.linalg.vector_norm(torch.stack(norms)))
        if not math.isfinite(norm):
            return None
        if len(self._norms) < WARMUP:
            self._norms.append(norm)
            return None
        bound = self.factor * statistics.median(self._norms)
        self._norms.append(min(norm, bound))
        if norm <= bound or bound <= 0:  # within, or no scale yet (a stage of zero gradients)
            return None
        scale = bound / norm
        for grad in grads:
            grad.mul_(scale)
        self.clipped += 1
        return scale
