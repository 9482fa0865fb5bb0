"""A stage's state built from saved states of other layer ranges: a plan that cuts the model
anew (stage L0-3 where L0-2 and L2-4 were saved) loses nothing.

A stage names its parameters by piece: `embed.*` (first stage), `blocks.{i}.*` (its i-th block,
layer `layers.start + i` of the model), `head.*` (last stage). AdamW keeps its moments by the
parameter's position in the optimizer's groups (train/optim.py). Both are renamed to model-wide
names (`block{layer}.*`) and back, so the new stage's weights and moments are exactly the old
ones: a test checks them bit for bit. Under diloco the outer state (anchor and outer momentum
per parameter, "outer/anchor/<name>", "outer/momentum/<name>") is renamed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.train.model import Stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.outer import ANCHOR, MOMENTUM

OUTER_PREFIXES = (ANCHOR, MOMENTUM)
OUTER_STEPS = "outer/steps"  # worker/averaging/outer_rounds.py's count of outer steps


def model_wide(name: str, layers: range) -> str:
    """A stage parameter's name as the whole model knows it: 'blocks.1.attn.c_attn.weight' of
    layers 2..3 -> 'block3.attn.c_attn.weight'; embedding and head names stay."""
    piece, _, rest = name.partition(".")
    if piece != "blocks":
        return name
    index, _, tail = rest.partition(".")
    return f"block{layers.start + int(index)}.{tail}"


def optimizer_names(model: Stage, optimizer: torch.optim.Optimizer) -> list[str]:
    """The model-wide name of each parameter, in the order the optimizer's state_dict numbers
    them (its groups in order, each group's parameters in order)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [
        model_wide(names[id(p)], model.layers) for g in optimizer.param_groups for p in g["params"]
    ]


def _source_optimizer_names(spec: RunSpec, layers: range) -> list[str]:
    """optimizer_names of a stage of `layers` as the run builds it (shapes only)."""
    with torch.device("meta"):
        shape = Stage(spec.model_config(), layers, spec.optim.seed)
    return optimizer_names(shape, make_optimizer(shape, spec))


def assemble(
    spec: RunSpec,
    model: Stage,
    optimizer: torch.optim.Optimizer,
    sources: Sequence[tuple[range, dict[str, Any]]],
    partial: bool = False,
) -> dict[str, torch.Tensor]:
    """Load into `model` and `optimizer` their parameters' weights and AdamW state, taken from
    `sources`: (layers, validated state: checkpoint_read.read_state) pairs, all of one step; each
    parameter from the first source that holds it. ValueError if one is in none of them, unless
    `partial` (worker/resume/covers.py: best_partial): those keep the model's initial weights
    and get no moments (AdamW starts them afresh).
    Returns the new stage's outer state ("outer/..." tensors, the count of outer steps the
    largest of the sources'), or {} unless the sources hold one for every parameter."""
    weights: dict[str, torch.Tensor] = {}
    moments: dict[str, Any] = {}
    outer: dict[str, torch.Tensor] = {}
    outer_steps = 0
    for layers, state in sources:
        saved_outer = state.get("outer_state", {})
        steps = saved_outer.get(OUTER_STEPS)
        if isinstance(steps, torch.Tensor) and steps.numel() == 1:
            outer_steps = max(outer_steps, int(steps.item()))
        stepped = state["optimizer_state"].get("state", {})
        order = _source_optimizer_names(spec, layers)
        by_name = {name: stepped[i] for i, name in enumerate(order) if i in stepped}
        for name, tensor in state["model_state"].items():
            wide = model_wide(name, layers)
            if wide not in weights:  # weights, moments, outer state of a parameter: one source
                weights[wide] = tensor
                if wide in by_name:
                    moments[wide] = by_name[wide]
                for prefix in OUTER_PREFIXES:
                    if prefix + name in saved_outer:
                        outer[prefix + wide] = saved_outer[prefix + name]
    current = model.state_dict()
    missing = [n for n in current if model_wide(n, model.layers) not in weights]
    if missing and not partial:
        raise ValueError(f"no source holds {', '.join(missing[:3])} of layers {model.layers}")
    model.load_state_dict(
        {n: weights.get(model_wide(n, model.layers), t) for n, t in current.items()}
    )
    target = optimizer.state_dict()
    target["state"] = {
        i: moments[name]
        for i, name in enumerate(optimizer_names(model, optimizer))
        if name in moments
    }
    optimizer.load_state_dict(target)
    named = [n for n, p in model.named_parameters() if p.requires_grad]
    renamed = {
        prefix + n: outer.get(prefix + model_wide(n, model.layers))
        for prefix in OUTER_PREFIXES
        for n in named
    }
    if any(t is None for t in renamed.values()):
        return {}
    return {
        **{k: t for k, t in renamed.items() if t is not None},
        OUTER_STEPS: torch.tensor(outer_steps, dtype=torch.int64),
    }
