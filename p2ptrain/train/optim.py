"""AdamW and its learning-rate schedule: linear warmup, then cosine decay to min_lr at the last step.

Both act per parameter, so a pipeline stage optimizing only its own parameters does exactly what a
single process optimizing the whole model does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from p2ptrain.records.run import RunSpec


def make_optimizer(model: nn.Module, spec: RunSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, gains or nothing else 1-D)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=spec.optim.lr, betas=(spec.optim.beta1, spec.optim.beta2), foreach=False
    )


def lr_at(step: int, spec: RunSpec) -> float:
    """The learning rate of step `step` (0-based)."""
    optim = spec.optim
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    decay_steps = max(1, optim.steps - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / decay_steps)
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (optim.lr - optim.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grads(model: nn.Module, max_norm: float) -> None:
    """Clip this stage's gradient norm (0 = off). Per stage, identically in every trainer."""
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def grads_are_finite(model: nn.Module) -> bool:
    """No NaN or infinity in any gradient: checked before every optimizer step, since one bad
    value (a poisoned average, a bad activation) would spread into the weights and the moments."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return all(bool(torch.isfinite(g).all()) for g in grads)
