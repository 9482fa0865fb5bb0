"""DiLoCo's outer step for one stage's parameters (`sync = "diloco"`).

Each replica of a stage takes `inner_steps` AdamW steps on its own batches; then the stage's group
averages the pseudo-gradient, the parameters at the last outer step (the anchor) minus the
parameters now, and every replica applies the same Nesterov SGD step to the anchor:

    m     <- momentum * m + delta          (delta: the group's mean pseudo-gradient)
    anchor <- anchor - lr * (delta + momentum * m)
    params <- anchor

which is torch.optim.SGD(nesterov=True) with the pseudo-gradient as the gradient (DiLoCo,
Douillard et al. 2023: lr 0.7, momentum 0.9). Replicas that start an outer step from the same
anchor and momentum and apply the same mean end with identical parameters. The inner AdamW keeps
its moments across outer steps, as in the paper.

The state (anchor, momentum, number of outer steps) is plain tensors plus JSON-able scalars, so
a stage's state file (train/state_file.py) can carry it beside the weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from p2ptrain.errors import WireError

ANCHOR = "outer/anchor/"
MOMENTUM = "outer/momentum/"
# a round's result is due this many steps after it started (at most). Long enough to spread a
# round's CPU thinly over a small worker's steps (worker/averaging/round_pacing.py); at H 30
# the final loss with 15 equals that with 5 (bench convergence's trainer, 300 steps: 1.0979 vs
# 1.0978 of step's; 10 gave 1.1021, within its noise)
MAX_OVERLAP_STEPS = 15


def overlap_steps(inner_steps: int) -> int:
    """Inner steps a round runs beside before its result is applied: half an outer period,
    at most MAX_OVERLAP_STEPS (a stale outer step hurts, Streaming DiLoCo's τ)."""
    return min(inner_steps // 2, MAX_OVERLAP_STEPS)


class OuterOptimizer:
    """The anchor and outer momentum of one stage; pseudo-gradients as one flat fp32 vector in
    the order of `module.named_parameters()` (the same on every replica of the stage)."""

    def __init__(self, module: nn.Module, lr: float, momentum: float) -> None:
        if not lr > 0 or not 0 <= momentum < 1:
            raise ValueError(f"need lr > 0 and 0 <= momentum < 1, got {lr}, {momentum}")
        self.lr = lr
        self.momentum = momentum
        self.named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self.anchor = self.flat_params()
        self.momentum_buffer = torch.zeros_like(self.anchor)
        self.outer_steps = 0

    @property
    def numel(self) -> int:
        return self.anchor.numel()

    def flat_params(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The stage's parameters now, as one flat fp32 vector (a copy, in the anchor's order;
        into `out` if given)."""
        return torch.cat([p.detach().float().reshape(-1) for _, p in self.named], out=out)

    def load_params(self, flat: torch.Tensor) -> None:
        """Set the stage's parameters from a flat vector in the anchor's order."""
        if flat.numel() != self.numel:
            raise ValueError(f"{flat.numel()} values for a stage of {self.numel}")
        offset = 0
        with torch.no_grad():
            for _, param in self.named:
                size = param.numel()
                param.copy_(flat[offset : offset + size].view_as(param))
                offset += size

    def pseudo_gradient(
        self, now: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """anchor - now: what this replica's inner steps moved, as one flat fp32 vector (`now`:
        the parameters as flat_params() gave them, default read afresh; into `out` if given)."""
        return torch.sub(self.anchor, self.flat_params() if now is None else now, out=out)

    def step(self, mean_pseudo_gradient: torch.Tensor) -> None:
        """Apply the outer Nesterov step with the group's mean pseudo-gradient; the parameters
        become the new anchor."""
        delta = mean_pseudo_gradient.detach().float().reshape(-1)
        if delta.numel() != self.numel:
            raise ValueError(f"pseudo-gradient of {delta.numel()} values, stage has {self.numel}")
        self.momentum_buffer.mul_(self.momentum).add_(delta)
        self.anchor.sub_(self.lr * (delta + self.momentum * self.momentum_buffer))
        self.outer_steps += 1
        self.load_params(self.anchor)

    # --- state: plain tensors + JSON-able scalars (a stage's state file carries them) ---

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The anchor and the momentum per parameter name, as fp32 tensors of its shape."""
        tensors = {}
        for prefix, flat in ((ANCHOR, self.anchor), (MOMENTUM, self.momentum_buffer)):
            offset = 0
            for name, param in self.named:
                size = param.numel()
                tensors[prefix + name] = flat[offset : offset + size].view(param.shape).clone()
                offset += size
        return tensors

    def state_scalars(self) -> dict[str, Any]:
        return {
            "outer_steps": self.outer_steps,
            "outer_lr": self.lr,
            "outer_momentum": self.momentum,
        }

    def load_state_tensors(
        self,
        tensors: dict[str, torch.Tensor],
        scalars: dict[str, Any],
        keep_params: bool = False,
    ) -> None:
        """Take a state from state_tensors()/state_scalars() (possibly another peer's): every
        parameter's anchor and momentum, of its shape and finite, and a count of outer steps;
        WireError otherwise (nothing changes then). The parameters become the anchor, unless
        `keep_params` (a replica resuming mid-way between outer steps keeps its inner progress)."""
        steps = scalars.get("outer_steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps < 2**53:
            raise WireError("malformed outer state: outer_steps")
        expected = {prefix + name for prefix in (ANCHOR, MOMENTUM) for name, _ in self.named}
        if {k for k in tensors if k.startswith((ANCHOR, MOMENTUM))} != expected:
            raise WireError("malformed outer state: not this stage's parameters")
        flats = []
        for prefix in (ANCHOR, MOMENTUM):
            parts = []
            for name, param in self.named:
                tensor = tensors[prefix + name]
                if tensor.shape != param.shape or not tensor.is_floating_point():
                    raise WireError(f"malformed outer state: {prefix + name} has the wrong shape")
                parts.append(tensor.detach().float().reshape(-1))
            flat = torch.cat(parts) if parts else torch.zeros(0)
            if not bool(torch.isfinite(flat).all()):
                raise WireError("malformed outer state: a value is not finite")
            flats.append(flat)
        self.anchor, self.momentum_buffer = flats
        self.outer_steps = steps
        if not keep_params:
            self.load_params(self.anchor)
