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


def fragment_spans(numel: int, fragments: int) -> list[tuple[int, int]]:
    """Streaming DiLoCo's fragments: the [start, end) slices of a stage's flat vector that
    sync at their own offsets within H (`outer_fragments`; one for the whole stage)."""
    count = max(1, min(fragments, numel))
    return [(f * numel // count, (f + 1) * numel // count) for f in range(count)]


def round_phase(
    stage: int, num_stages: int, fragment: int, fragments: int, inner_steps: int
) -> int:
    """The step phase within H of a stage's fragment's rounds: every (stage, fragment) slot
    evenly staggered over H, a stage's own fragments H / fragments apart (fragments <= H)."""
    return (fragment * num_stages + stage) * inner_steps // (num_stages * fragments)


def fragments_due(
    step: int, steps: int, inner_steps: int, stage: int, num_stages: int, fragments: int
) -> list[int]:
    """The fragments of stage `stage` whose round starts after training `step`: each at its
    phase, from the first period's end on (a slot's first round covers at least H steps, so
    staggering adds no round: a run moves the bytes of one round a stage every H steps), and
    all of them after the run's last step, so every stage ends with its replicas in agreement."""
    done = step + 1
    if done == steps:
        return list(range(fragments))
    if done < inner_steps:
        return []
    phase = done % inner_steps
    return [
        f
        for f in range(fragments)
        if round_phase(stage, num_stages, f, fragments, inner_steps) == phase
    ]


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

    def flat_params(
        self, out: torch.Tensor | None = None, span: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """The stage's parameters now, as one flat fp32 vector (a copy, in the anchor's order;
        into `out` if given); `span`: only that [start, end) slice of it (a fragment)."""
        if span is None:
            return torch.cat([p.detach().float().reshape(-1) for _, p in self.named], out=out)
        pieces = [p.detach().reshape(-1)[lo:hi].float() for p, lo, hi in self._overlaps(span)]
        return torch.cat(pieces, out=out)

    def _overlaps(self, span: tuple[int, int]) -> list[tuple[nn.Parameter, int, int]]:
        """Each parameter that `span` of the flat vector covers, with the covered [lo, hi)
        of its own flat values."""
        start, end = span
        found, offset = [], 0
        for _, param in self.named:
            size = param.numel()
            lo, hi = max(start - offset, 0), min(end - offset, size)
            if lo < hi:
                found.append((param, lo, hi))
            offset += size
        return found

    def load_params(self, flat: torch.Tensor, span: tuple[int, int] | None = None) -> None:
        """Set the stage's parameters from a flat vector in the anchor's order (`span`: set
        only that slice, from a vector of its length)."""
        start, end = (0, self.numel) if span is None else span
        if flat.numel() != end - start or not 0 <= start <= end <= self.numel:
            raise ValueError(f"{flat.numel()} values for [{start}, {end}) of {self.numel}")
        offset = 0
        with torch.no_grad():
            for param, lo, hi in self._overlaps((start, end)):
                param.view(-1)[lo:hi].copy_(flat[offset : offset + hi - lo])
                offset += hi - lo

    def pseudo_gradient(
        self,
        now: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        span: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """anchor - now: what this replica's inner steps moved, as one flat fp32 vector (`now`:
        the parameters as flat_params() gave them, default read afresh; into `out` if given;
        `span`: of that slice only, `now` then of its length)."""
        anchor = self.anchor if span is None else self.anchor[span[0] : span[1]]
        now = self.flat_params(span=span) if now is None else now
        return torch.sub(anchor, now, out=out)

    def step(self, mean_pseudo_gradient: torch.Tensor, span: tuple[int, int] | None = None) -> None:
        """Apply the outer Nesterov step with the group's mean pseudo-gradient; the parameters
        become the new anchor. `span`: a fragment's step, of that slice only; the count of
        outer steps moves with the stage's first fragment's (the stage's once a period)."""
        start, end = (0, self.numel) if span is None else span
        delta = mean_pseudo_gradient.detach().float().reshape(-1)
        if delta.numel() != end - start:
            raise ValueError(f"pseudo-gradient of {delta.numel()} values for [{start}, {end})")
        momentum = self.momentum_buffer[start:end]
        momentum.mul_(self.momentum).add_(delta)
        anchor = self.anchor[start:end]
        anchor.sub_(self.lr * (delta + self.momentum * momentum))
        if start == 0:
            self.outer_steps += 1
        self.load_params(anchor, span)

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
        device = self.anchor.device  # the stage's: a state is read onto the CPU
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
            flats.append(flat.to(device))
        self.anchor, self.momentum_buffer = flats
        self.outer_steps = steps
        if not keep_params:
            self.load_params(self.anchor)
