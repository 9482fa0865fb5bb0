"""Stage checkpoints: weights, optimizer state and step of one contiguous layer range.

A file is named by its layer range, not by the peer that wrote it, so any peer later assigned the
same stage can load it. Loading validates the format, run, model shape, layer range and every
tensor's shape before touching the model; writes are atomic (temp file + rename) because replicas
of a stage on one machine may write the same file.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from p2ptrain.errors import UserError
from p2ptrain.runspec import RunSpec
from p2ptrain.train.model import GPTConfig, Stage

FORMAT = "p2ptrain.stage-checkpoint/1"


def checkpoint_dir(spec: RunSpec) -> Path:
    """Where the run's checkpoints live: spec.checkpoint_dir or runs/<run_id>/checkpoints."""
    return Path(spec.checkpoint_dir or os.path.join("runs", spec.run_id, "checkpoints"))


def checkpoint_path(directory: Path, layers: range) -> Path:
    return directory / f"stage-L{layers.start}-{layers.stop}.pt"


def save_stage(
    path: Path, spec: RunSpec, model: Stage, optimizer: torch.optim.Optimizer, step: int
) -> None:
    """Atomically write the stage's state; `step` is the next step to run."""
    state = {
        "format": FORMAT,
        "run_id": spec.run_id,
        "model": dataclasses.asdict(model.config),
        "layers": [model.layers.start, model.layers.stop],
        "step": step,
        "model_state": model.state_dict(),
        "optimizer_state": optimizer.state_dict(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def load_stage(
    path: Path, spec: RunSpec, model: Stage, optimizer: torch.optim.Optimizer | None = None
) -> int:
    """Validate a checkpoint and load it into `model` (and `optimizer`); return its step."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a torn or foreign file: say which
        raise UserError(f"checkpoint {path} is unreadable: {exc}") from exc
    problem = _check(state, spec, model)
    if problem:
        raise UserError(f"checkpoint {path} does not fit this stage: {problem}")
    model.load_state_dict(state["model_state"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer_state"])
    return int(state["step"])


def _check(state: Any, spec: RunSpec, model: Stage) -> str | None:
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return "not a p2ptrain stage checkpoint"
    if state.get("run_id") != spec.run_id:
        return f"run {state.get('run_id')!r}, expected {spec.run_id!r}"
    if state.get("model") != dataclasses.asdict(GPTConfig.from_spec(spec)):
        return f"model {state.get('model')}, expected the run's model"
    if state.get("layers") != [model.layers.start, model.layers.stop]:
        return f"layers {state.get('layers')}, expected {[model.layers.start, model.layers.stop]}"
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= spec.steps:
        return f"bad step {step!r}"
    saved, expected = state.get("model_state"), model.state_dict()
    if not isinstance(saved, dict) or set(saved) != set(expected):
        return "parameter names differ"
    for name, tensor in expected.items():
        other = saved[name]
        if (
            not isinstance(other, torch.Tensor)
            or other.shape != tensor.shape
            or other.dtype != tensor.dtype
        ):
            return f"tensor {name} has the wrong shape or dtype"
        if not torch.isfinite(other).all():
            return f"tensor {name} holds NaN or inf"
    if not isinstance(state.get("optimizer_state"), dict):
        return "optimizer state missing"
    return None
