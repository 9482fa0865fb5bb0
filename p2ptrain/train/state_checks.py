"""The checks a saved stage state's AdamW and DiLoCo parts pass before they touch a stage
(train/checkpoint_read.py runs them beside the weights' checks), and loading the AdamW part.

A state may come from another peer (worker/resume/state_transfer.py), and a lone holder of a
stage decides its numbers only (docs/security.md, 4b). So nothing in a file configures the
optimizer: every hyperparameter (lr, betas, eps, weight decay, maximize, amsgrad, fused...) stays
the one of the optimizer the run built, and a file gives each parameter only the state AdamW
would hold for it: its moments of the parameter's shape and dtype, finite, the second moment
>= 0, and a step count that is a whole number >= 0. Anything else would make the fetcher's
AdamW diverge (the square root of a negative second moment is NaN) or raise in
`optimizer.step()` and end its worker. The outer state (anchor and outer momentum) is held to
its stage's shapes the same way, and its count of outer steps must be an integer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from p2ptrain.records.fields import MAX_INT
from p2ptrain.train.outer import ANCHOR, MOMENTUM
from p2ptrain.train.recut import OUTER_STEPS

MOMENTS = ("exp_avg", "exp_avg_sq")
NON_NEGATIVE = ("exp_avg_sq", "max_exp_avg_sq")  # AdamW takes their square roots


def optimizer_problem(saved: object, optimizer: torch.optim.Optimizer) -> str | None:
    """Why `saved` (a file's Optimizer.state_dict()) cannot give `optimizer`'s parameters their
    AdamW state, or None. A parameter's index is its place in `optimizer`'s groups."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return "optimizer state missing"
    params = [(p, group) for group in optimizer.param_groups for p in group["params"]]
    for index, values in saved["state"].items():
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(params):
            return f"optimizer state of no parameter ({str(index)[:20]!r})"
        param, group = params[index]
        problem = _adam_problem(values, param, group)
        if problem:
            return f"optimizer state of parameter {index}: {problem}"
    return None


def tensor_problem(name: str, tensor: object, shape: torch.Size, dtype: torch.dtype) -> str | None:
    """Why a tensor read from a state file cannot stand where one of `shape` and `dtype` goes."""
    if not isinstance(tensor, torch.Tensor) or tensor.shape != shape or tensor.dtype != dtype:
        return f"{name} has the wrong shape or dtype"
    if not bool(torch.isfinite(tensor).all()):
        return f"{name} holds NaN or inf"
    return None


def _adam_problem(values: object, param: torch.Tensor, group: dict[str, Any]) -> str | None:
    moments = MOMENTS + (("max_exp_avg_sq",) if group.get("amsgrad") else ())
    # exactly AdamW's fields: with one missing, its first step raises a KeyError
    if not isinstance(values, dict) or set(values) != {"step", *moments}:
        return "not AdamW's fields"
    for name in moments:
        tensor = values[name]
        if problem := tensor_problem(name, tensor, param.shape, param.dtype):
            return problem
        if name in NON_NEGATIVE and bool((tensor < 0).any()):
            return f"{name} is negative"
    step = values["step"]
    if not isinstance(step, torch.Tensor) or step.shape != () or not step.is_floating_point():
        return "step is not a scalar count"
    count = float(step)
    # below 0 the bias correction divides by 0; a whole number, as AdamW counts
    if not (math.isfinite(count) and 0 <= count <= MAX_INT and count == int(count)):
        return f"step {count!r} is not a whole number in [0, {MAX_INT}]"
    return None


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Give `optimizer`'s parameters the AdamW state of `saved` (optimizer_problem found none):
    the param groups, every hyperparameter in them, stay the optimizer's own, the run's."""
    target = optimizer.state_dict()
    target["state"] = dict(saved["state"])
    optimizer.load_state_dict(target)


def outer_problem(saved: object, model: nn.Module) -> str | None:
    """Why `saved` (a file's "outer/..." tensors) is not a DiLoCo outer state of `model`, or
    None: none at all, or the anchor and outer momentum of every trainable parameter, fp32 of
    its shape and finite, and the count of outer steps (worker/averaging/outer_rounds.py)."""
    if not isinstance(saved, dict):
        return "outer state malformed"
    if not saved:
        return None
    named = {name: p for name, p in model.named_parameters() if p.requires_grad}
    expected = {prefix + name: p for prefix in (ANCHOR, MOMENTUM) for name, p in named.items()}
    if set(saved) != {*expected, OUTER_STEPS}:
        return "outer state is not of this stage's parameters"
    for name, param in expected.items():
        if problem := tensor_problem(name, saved[name], param.shape, torch.float32):
            return problem
    steps = saved[OUTER_STEPS]
    # read with int(steps.item()): a float NaN there would raise, not be refused
    if not isinstance(steps, torch.Tensor) or steps.shape != () or steps.dtype != torch.int64:
        return "outer/steps is not an integer count"
    if not 0 <= int(steps) <= MAX_INT:
        return f"outer/steps {int(steps)} is out of range"
    return None
