"""A stage state's AdamW and DiLoCo parts (train/state_checks.py): a file gives each parameter
only its AdamW state, every hyperparameter stays the run's; moments of the wrong shape or dtype,
not finite, a negative second moment, a bad step count or a bad outer state are refused with
the UserError of a bad checkpoint (the fetch path then tries another holder), never raised as
anything else or later in optimizer.step()."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors
import safetensors.torch
import torch

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import stamped_path
from p2ptrain.train.checkpoint_read import load_stage, read_state
from p2ptrain.train.model import Stage, build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.outer import OuterOptimizer
from p2ptrain.train.recut import OUTER_STEPS
from p2ptrain.train.snapshot import StageSnapshot

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10, weight_decay=0.1)
HOSTILE_HYPERPARAMETERS = {
    "lr": 1e9,
    "betas": [2.0, 2.0],
    "eps": -1.0,
    "weight_decay": -5.0,
    "maximize": True,
    "amsgrad": True,
    "foreach": True,
    "fused": True,
    "capturable": True,
    "differentiable": True,
}
Tensors = dict[str, torch.Tensor]
Meta = dict[str, Any]


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    torch.manual_seed(0)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(2, 8, 16)).float().pow(2).mean().backward()
        optimizer.step()


def saved_state(directory: Path, diloco: bool = False) -> Path:
    """Layers 1-2 of SPEC after 3 AdamW steps (with an outer state after one outer step)."""
    model = build_stage(SPEC, 1, 2)
    optimizer = make_optimizer(model, SPEC)
    _train(model, optimizer, 3)
    outer = None
    if diloco:
        state = OuterOptimizer(model, 0.7, 0.9)
        state.step(torch.full((state.numel,), 0.01))
        outer = {**state.state_tensors(), OUTER_STEPS: torch.tensor(1, dtype=torch.int64)}
    record_step(directory, SPEC, model, StageSnapshot.take(model, optimizer, 3, outer))
    return stamped_path(directory, model.layers, 3)


def crafted(
    path: Path,
    target: Path,
    tensors: Callable[[Tensors], None] = lambda t: None,
    meta: Callable[[Meta], None] = lambda m: None,
) -> Path:
    """A copy of the state file at `path`, written at `target`, with its tensors and metadata
    edited in place by `tensors` and `meta` (what a hostile holder could serve)."""
    with safetensors.safe_open(str(path), "pt") as opened:
        found = {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118
        metadata = json.loads(opened.metadata()[state_file.METADATA_KEY])
    tensors(found)
    meta(metadata)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(metadata)
    safetensors.torch.save_file(found, str(target), metadata={state_file.METADATA_KEY: text})
    return target


def _fresh() -> tuple[Stage, torch.optim.AdamW]:
    model = build_stage(SPEC, 1, 2)
    return model, make_optimizer(model, SPEC)


def _hostile_groups(meta: Meta) -> None:
    for group in meta["param_groups"]:
        group.update(HOSTILE_HYPERPARAMETERS)


def test_a_state_s_hyperparameters_are_ignored_the_run_s_are_kept(tmp_path: Path) -> None:
    honest = saved_state(tmp_path)
    hostile = crafted(honest, tmp_path / "hostile.pt", meta=_hostile_groups)
    model, optimizer = _fresh()
    expected = make_optimizer(model, SPEC).state_dict()["param_groups"]
    assert load_stage(hostile, SPEC, model, optimizer) == 3
    assert optimizer.state_dict()["param_groups"] == expected
    # the moments did come from the file, and training goes on as from the honest file
    other, other_optimizer = _fresh()
    load_stage(honest, SPEC, other, other_optimizer)
    for index, values in other_optimizer.state_dict()["state"].items():
        for name, tensor in values.items():
            assert torch.equal(optimizer.state_dict()["state"][index][name], tensor)
    _train(model, optimizer, 2)
    _train(other, other_optimizer, 2)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b)
    # and a stage built from it (read_state: a new cut) gets the moments, not the settings
    assert read_state(hostile, SPEC, range(1, 2))["optimizer_state"]["state"].keys() == (
        optimizer.state_dict()["state"].keys()
    )


def _set(name: str, value: torch.Tensor) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.__setitem__(name, value)


def _scaled(name: str, factor: float) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.__setitem__(name, tensors[name] * factor)


def _poke(name: str, value: float) -> Callable[[Tensors], None]:
    def poke(tensors: Tensors) -> None:
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = value

    return poke


def _as(name: str, dtype: torch.dtype) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.__setitem__(name, tensors[name].to(dtype))


def _drop(name: str) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.__delitem__(name)


def _extra_param(tensors: Tensors) -> None:
    tensors["optim/99/exp_avg"] = torch.zeros(3)


def _extra_group(meta: Meta) -> None:
    meta["param_groups"].append({"params": [99], "lr": 0.1})


BAD_ADAM: dict[str, tuple[Callable[[Tensors], None], Callable[[Meta], None]]] = {
    "exp_avg of another shape": (_set("optim/0/exp_avg", torch.zeros(3)), lambda m: None),
    "exp_avg of another dtype": (_as("optim/0/exp_avg", torch.float64), lambda m: None),
    "exp_avg NaN": (_poke("optim/0/exp_avg", float("nan")), lambda m: None),
    "exp_avg_sq inf": (_poke("optim/1/exp_avg_sq", float("inf")), lambda m: None),
    "exp_avg_sq negative": (_scaled("optim/0/exp_avg_sq", -1.0), lambda m: None),
    "exp_avg_sq missing": (_drop("optim/0/exp_avg_sq"), lambda m: None),
    "a field AdamW has not": (_set("optim/0/momentum_buffer", torch.zeros(1)), lambda m: None),
    "step negative": (_set("optim/0/step", torch.tensor(-1.0)), lambda m: None),
    "step NaN": (_set("optim/0/step", torch.tensor(float("nan"))), lambda m: None),
    "step inf": (_set("optim/0/step", torch.tensor(float("inf"))), lambda m: None),
    "step huge": (_set("optim/0/step", torch.tensor(1e300, dtype=torch.float64)), lambda m: None),
    "step fractional": (_set("optim/0/step", torch.tensor(1.5)), lambda m: None),
    "step not a scalar": (_set("optim/0/step", torch.ones(2)), lambda m: None),
    "step an integer tensor": (_set("optim/0/step", torch.tensor(3)), lambda m: None),
    "step missing": (_drop("optim/0/step"), lambda m: None),
    "step a metadata number": (
        _drop("optim/0/step"),
        lambda m: m.__setitem__("scalars", {"0": {"step": 3.0}}),
    ),
    "a parameter the stage has not": (_extra_param, _extra_group),
}


@pytest.mark.parametrize("case", BAD_ADAM)
def test_a_bad_adam_state_is_refused_and_nothing_is_loaded(tmp_path: Path, case: str) -> None:
    tensors, meta = BAD_ADAM[case]
    bad = crafted(saved_state(tmp_path), tmp_path / "bad.pt", tensors, meta)
    model, optimizer = _fresh()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    with pytest.raises(UserError, match="optimizer state"):
        load_stage(bad, SPEC, model, optimizer)
    with pytest.raises(UserError, match="optimizer state"):
        load_stage(bad, SPEC, model)  # checked without an optimizer to load into too
    with pytest.raises(UserError, match="optimizer state"):
        read_state(bad, SPEC, range(1, 2))
    assert not optimizer.state
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())
    _train(model, optimizer, 1)  # the stage still trains


ANCHOR0 = "outer/anchor/blocks.0.attn.c_attn.weight"
MOMENTUM0 = "outer/momentum/blocks.0.attn.c_attn.weight"
BAD_OUTER: dict[str, Callable[[Tensors], None]] = {
    "anchor of another shape": _set(ANCHOR0, torch.zeros(3)),
    "anchor of another dtype": _as(ANCHOR0, torch.float64),
    "momentum NaN": _poke(MOMENTUM0, float("nan")),
    "momentum missing": _drop(MOMENTUM0),
    "an anchor of no parameter": _set("outer/anchor/evil", torch.zeros(1)),
    "steps NaN": _set(OUTER_STEPS, torch.tensor(float("nan"))),
    "steps negative": _set(OUTER_STEPS, torch.tensor(-1, dtype=torch.int64)),
    "steps not a scalar": _set(OUTER_STEPS, torch.ones(2, dtype=torch.int64)),
    "steps missing": _drop(OUTER_STEPS),
}


@pytest.mark.parametrize("case", BAD_OUTER)
def test_a_bad_outer_state_is_refused(tmp_path: Path, case: str) -> None:
    saved = saved_state(tmp_path, diloco=True)
    assert ANCHOR0 in safetensors.safe_open(str(saved), "pt").keys()  # noqa: SIM118
    bad = crafted(saved, tmp_path / "bad.pt", BAD_OUTER[case])
    model, optimizer = _fresh()
    outer: Tensors = {}
    with pytest.raises(UserError, match="outer"):
        load_stage(bad, SPEC, model, optimizer, outer)
    with pytest.raises(UserError, match="outer"):
        read_state(bad, SPEC, range(1, 2))
    assert not outer and not optimizer.state


def test_a_valid_state_round_trips_with_its_outer_state(tmp_path: Path) -> None:
    saved = saved_state(tmp_path, diloco=True)
    with safetensors.safe_open(str(saved), "pt") as opened:
        stored = {n: opened.get_tensor(n) for n in opened.keys()}  # noqa: SIM118
    model, optimizer = _fresh()
    outer: Tensors = {}
    assert load_stage(saved, SPEC, model, optimizer, outer) == 3
    assert outer.keys() == {n for n in stored if n.startswith("outer/")}
    assert all(torch.equal(stored[n], t) for n, t in outer.items())
    assert all(torch.equal(stored[f"model/{n}"], t) for n, t in model.state_dict().items())
    for index, values in optimizer.state_dict()["state"].items():
        assert values.keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(stored[f"optim/{index}/{n}"], t) for n, t in values.items())
    assert read_state(saved, SPEC, range(1, 2))["outer_state"].keys() == outer.keys()
