"""Reading a stage checkpoint back (train/checkpoint.py writes them): the file's formats and the
checks a saved state passes before it touches a model.

Format /3 (train/state_file.py) is read without unpickling anything. Files of the older formats
(torch.save pickles: /1 with the weights pickled, /2 with the optimizer state pickled) still load
from this machine's own disk, with a warning; a peer never receives one (worker/resume/
state_transfer.py refuses them on both sides). Loading validates the format, run, model shape,
layer range and every tensor's shape before touching the model; of the optimizer state only
each parameter's AdamW state is taken, never a hyperparameter (train/state_checks.py).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from p2ptrain.errors import UserError
from p2ptrain.records.model_config import ModelConfig
from p2ptrain.records.run import RunSpec
from p2ptrain.records.stage_state import FORMAT
from p2ptrain.train import state_file
from p2ptrain.train.model import Stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.state_checks import (
    load_optimizer,
    optimizer_problem,
    outer_problem,
    tensor_problem,
)

log = logging.getLogger(__name__)

# torch.save pickles, still read from this machine's own disk (never from a peer):
PICKLED_OPTIMIZER_FORMAT = "p2ptrain.stage-checkpoint/2"  # weights as a safetensors blob
PICKLED_WEIGHTS_FORMAT = "p2ptrain.stage-checkpoint/1"  # before safetensors
KNOWN_FORMATS = (FORMAT, PICKLED_OPTIMIZER_FORMAT, PICKLED_WEIGHTS_FORMAT)
# the model entry of a format /1 file: nanoGPT's sizes only
_V1_MODEL_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def read_file(path: Path) -> dict[str, Any]:
    """A checkpoint file's contents (not yet validated: load_stage and read_state do that):
    format, run_id, model, layers, step, model_state, optimizer_state. UserError if it cannot
    be read at all. Files of the pickled formats are read too: only files of this machine's own
    disk reach here, as a fetched file is kept only in format /3 (worker/resume/state_transfer.py)."""
    try:
        if not state_file.is_pickled(path):
            return state_file.read(path)
        log.warning(
            "%s is a checkpoint of an older format (a torch pickle): loaded from this "
            "machine's disk only, never sent to peers; the next save writes format /3",
            path,
        )
        with state_file.open_state(path) as f:  # the regular file is_pickled checked, no FIFO
            state = torch.load(f, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and state.get("format") == PICKLED_OPTIMIZER_FORMAT:
            blob = state.pop("weights")
            if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8:
                raise ValueError("weights are not a safetensors blob")
            state["model_state"] = safetensors.torch.load(blob.numpy().tobytes())
    except Exception as exc:  # a torn or foreign file: say which
        raise UserError(f"checkpoint {path} is unreadable: {exc}") from exc
    return state if isinstance(state, dict) else {}


def load_stage(
    path: Path,
    spec: RunSpec,
    model: Stage,
    optimizer: torch.optim.Optimizer | None = None,
    outer_state: dict[str, torch.Tensor] | None = None,
) -> int:
    """Validate a checkpoint and load it into `model` (and `optimizer`: the AdamW state of each
    parameter, its hyperparameters stay the run's); return its step. `outer_state`, if given,
    gets the file's DiLoCo tensors (none: the file has no outer state)."""
    state = read_file(path)
    reference = optimizer if optimizer is not None else make_optimizer(model, spec)
    problem = _check(state, spec, model, reference)
    if problem:
        raise UserError(f"checkpoint {path} does not fit this stage: {problem}")
    model.load_state_dict(state["model_state"])
    if optimizer is not None:
        load_optimizer(optimizer, state["optimizer_state"])
    if outer_state is not None:
        outer_state.clear()
        outer_state.update(state.get("outer_state", {}))
    return int(state["step"])


def read_state(path: Path, spec: RunSpec, layers: range) -> dict[str, Any]:
    """A saved state of `layers`, validated as load_stage does, without a model to load it
    into (train/recut.py builds another stage from it)."""
    state = read_file(path)
    with torch.device("meta"):  # shapes only: no memory, no init
        shape = Stage(spec.model_config(), layers, spec.optim.seed)
    problem = _check(state, spec, shape, make_optimizer(shape, spec))
    if problem:
        raise UserError(f"checkpoint {path} does not fit layers {layers}: {problem}")
    return dict(state)


def _same_model(saved: Any, config: ModelConfig) -> bool:
    expected = dataclasses.asdict(config)
    if saved == expected:
        return True
    # a format /1 file names nanoGPT's five sizes only
    old = {name: expected[name] for name in _V1_MODEL_FIELDS}
    return config.family == "nanogpt" and saved == old


def _other_run(state: dict[str, Any], spec: RunSpec) -> str | None:
    """Why a saved state is not of this run (run id, model shape, data digest), or None."""
    if state.get("run_id") != spec.run_id:
        return f"run {state.get('run_id')!r}, expected {spec.run_id!r}"
    if not _same_model(state.get("model"), spec.model_config()):
        return f"model {state.get('model')}, expected the run's model"
    data = state.get("data_sha256", "")  # older files do not say: their run id and model do
    if data and spec.data.data_sha256 and data != spec.data.data_sha256:
        return f"data digest {data!r}, expected {spec.data.data_sha256!r}"
    return None


_runs: dict[tuple[str, int, int, int, str], str | None] = {}


def _run_facts(path: Path) -> dict[str, Any]:
    """What `_other_run` compares (run id, model, data digest): a format /3 file's from its
    header, once its size shows it whole (a restart's report and every prune ask this of states
    that can be gigabytes), an older pickled one's from the whole file."""
    if state_file.is_pickled(path):
        return read_file(path)
    return state_file.check_whole(path).to_dict()


def other_run(path: Path, spec: RunSpec) -> str | None:
    """Why the state file at `path` is not of `spec`'s run (another run id, model shape or data
    digest, or unreadable), None if it is; remembered while the file is unchanged. A swarm
    adopts another lineage's state only if this is None (worker/resume/adopt.py)."""
    try:
        stat = path.stat()
    except OSError as exc:
        return f"gone: {exc.strerror}"
    run = f"{spec.run_id}|{spec.data.data_sha256}|{spec.model_config()!r}"
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, run)
    if key not in _runs:
        try:
            state = _run_facts(path)
            problem = (
                "not a p2ptrain stage checkpoint"
                if state.get("format") not in KNOWN_FORMATS
                else _other_run(state, spec)
            )
        except UserError as exc:
            problem = str(exc)
        except OSError as exc:
            problem = f"unreadable: {exc.strerror}"
        if len(_runs) > 1024:
            _runs.clear()
        _runs[key] = problem
    return _runs[key]


def _check(state: Any, spec: RunSpec, model: Stage, optimizer: torch.optim.Optimizer) -> str | None:
    if not isinstance(state, dict) or state.get("format") not in KNOWN_FORMATS:
        return "not a p2ptrain stage checkpoint"
    problem = _other_run(state, spec)
    if problem:
        return problem
    if state.get("layers") != [model.layers.start, model.layers.stop]:
        return f"layers {state.get('layers')}, expected {[model.layers.start, model.layers.stop]}"
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= spec.optim.steps:
        return f"bad step {step!r}"
    saved, expected = state.get("model_state"), model.state_dict()
    if not isinstance(saved, dict) or set(saved) != set(expected):
        return "parameter names differ"
    for name, tensor in expected.items():
        if problem := tensor_problem(f"tensor {name}", saved[name], tensor.shape, tensor.dtype):
            return problem
    return optimizer_problem(state.get("optimizer_state"), optimizer) or outer_problem(
        state.get("outer_state", {}), model
    )
