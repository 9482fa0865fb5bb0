"""Stage checkpoints: weights, optimizer state and step of one contiguous layer range.

One file per state, a safetensors file (format /3, train/state_file.py): the weights and AdamW's
moments as tensors, and the metadata (format, run, model config, layers, step, the optimizer's
hyperparameters) as JSON in its header; nothing in it is unpickled (docs/security.md, 26.7). One
file, not a weights file beside an optimizer file, because a state moves between peers by its
one digest (worker/resume/state_transfer.py) and is written atomically by one rename. The file names
keep their `.pt` ending. Files of the older formats (torch.save pickles: /1 with the weights
pickled, /2 with the optimizer state pickled) still load from this machine's own disk, with a
warning; a peer never receives one (worker/resume/state_transfer.py refuses them on both sides).

A file is named by its layer range, not by the peer that wrote it, so any peer later assigned the
same stage can load it. Loading validates the format, run, model shape, layer range and every
tensor's shape before touching the model; writes are atomic (temp file + rename) because replicas
of a stage on one machine may write the same file.

History: `stage-L{a}-{b}.step{N}.{tag}.pt` keeps the stage's state at the last few step
boundaries (KEEP_STEPS), and `stage-L{a}-{b}.pt` is a hard link to the newest. A swarm switching
to a new plan restarts every stage from one common step (worker/resume/start_step.py); the stages of a
pipeline can be one step apart when a plan interrupts them, so each must be able to go one step
back. The tag names the plan lineage the state was saved under (records/lineage.py: a plan uses
only states of its own lineage or its ancestors'); a state of the root lineage (saved under a
plan without a lineage, or before lineages existed) has none: `stage-L{a}-{b}.step{N}.pt`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
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

log = logging.getLogger(__name__)

# torch.save pickles, still read from this machine's own disk (never from a peer):
PICKLED_OPTIMIZER_FORMAT = "p2ptrain.stage-checkpoint/2"  # weights as a safetensors blob
PICKLED_WEIGHTS_FORMAT = "p2ptrain.stage-checkpoint/1"  # before safetensors
KNOWN_FORMATS = (FORMAT, PICKLED_OPTIMIZER_FORMAT, PICKLED_WEIGHTS_FORMAT)
# the model entry of a format /1 file: nanoGPT's sizes only
_V1_MODEL_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
KEEP_STEPS = 4  # stamped files kept per stage
STATE_MARGIN = 1.25  # a saved state over its tensors' bytes: its header, alignment
STATE_OVERHEAD_BYTES = 4 * 1024**2
_STAMPED = re.compile(r"^stage-L(\d+)-(\d+)\.step(\d+)(?:\.([0-9a-f]{16}-e\d{1,16}))?\.pt$")


def checkpoint_dir(spec: RunSpec) -> Path:
    """Where the run's checkpoints live: spec.checkpoint_dir or runs/<run_id>/checkpoints."""
    return Path(spec.checkpoint_dir or os.path.join("runs", spec.run_id, "checkpoints"))


def checkpoint_path(directory: Path, layers: range) -> Path:
    return directory / f"stage-L{layers.start}-{layers.stop}.pt"


def layers_key(layers: range) -> str:
    """How announcements and file names name a stage: 'L0-2' for layers 0 and 1."""
    return f"L{layers.start}-{layers.stop}"


def stamped_path(directory: Path, layers: range, step: int, tag: str | None = None) -> Path:
    """The file of a stage's state at `step`, saved under lineage `tag` (None: the root)."""
    suffix = "" if tag is None else f".{tag}"
    return directory / f"stage-{layers_key(layers)}.step{step}{suffix}.pt"


@dataclass(frozen=True)
class SavedState:
    """One stamped state file: its stage (layers key), step and lineage tag."""

    key: str
    step: int
    tag: str | None
    path: Path


def list_states(directory: Path) -> list[SavedState]:
    """The stamped states the directory holds (from file names), sorted by stage, step, tag."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        match = _STAMPED.match(name)
        if match:
            key = f"L{int(match[1])}-{int(match[2])}"
            found.append(SavedState(key, int(match[3]), match[4], directory / name))
    return sorted(found, key=lambda s: (s.key, s.step, s.tag or ""))


def saved_steps(directory: Path) -> dict[str, list[int]]:
    """Which stage states the directory holds, of any lineage: layers key -> sorted steps."""
    found: dict[str, set[int]] = {}
    for state in list_states(directory):
        found.setdefault(state.key, set()).add(state.step)
    return {key: sorted(steps) for key, steps in found.items()}


_digests: dict[tuple[str, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """The sha256 (hex) of a file, remembered while the file is unchanged (states are written
    once, by rename, and announced at every plan)."""
    stat = path.stat()
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1024 * 1024):
                digest.update(chunk)
        if len(_digests) > 1024:
            _digests.clear()
        _digests[key] = digest.hexdigest()
    return _digests[key]


def expected_state_bytes(spec: RunSpec, layers: range) -> int:
    """An upper bound on the size of a saved state of `layers`: the weights and AdamW's two
    moments (under diloco also the anchor and outer momentum), with a margin for the file's
    structure (what state transfer accepts at most)."""
    with torch.device("meta"):  # shapes only: no memory, no init
        stage = Stage(spec.model_config(), layers, spec.seed)
    weights = sum(t.numel() * t.element_size() for t in stage.state_dict().values())
    copies = 5 if spec.sync == "diloco" else 3
    return int(copies * weights * STATE_MARGIN) + STATE_OVERHEAD_BYTES


@dataclass(frozen=True)
class StageSnapshot:
    """A stage's state at one step boundary, copied out of the live model and optimizer (and
    under diloco the outer state, worker/averaging/outer_rounds.py's "outer/..." tensors)."""

    step: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    outer_state: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    @classmethod
    def take(
        cls,
        model: Stage,
        optimizer: torch.optim.Optimizer,
        step: int,
        outer_state: dict[str, torch.Tensor] | None = None,
    ) -> StageSnapshot:
        """Copies in host memory: on a GPU the snapshot would otherwise double the device memory
        of the weights and AdamW state (the planner's memory estimate counts them once)."""
        return cls(
            step,
            _host_copy(model.state_dict()),
            _host_copy(optimizer.state_dict()),
            _host_copy(outer_state or {}),
        )


def _host_copy(value: Any) -> Any:
    """`value` with every tensor copied to the CPU (nested dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _host_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_host_copy(item) for item in value)
    return copy.deepcopy(value)


def record_step(
    directory: Path,
    spec: RunSpec,
    model: Stage,
    snapshot: StageSnapshot,
    tag: str | None = None,
    usable: Callable[[str | None], bool] = lambda tag: True,
) -> None:
    """Write `snapshot` as the stamped state of its step under lineage `tag`, point the stage's
    latest file at the newest state `usable` accepts (the writer's lineage and its ancestors'),
    and keep the KEEP_STEPS newest steps of the writer's own lineage: its older files go, files
    of every other lineage stay (another swarm's or another half's progress is not ours to
    delete: `p2ptrain checkpoints prune` removes them)."""
    layers = model.layers
    _write(stamped_path(directory, layers, snapshot.step, tag), spec, model, snapshot)
    key = layers_key(layers)
    states = [s for s in list_states(directory) if s.key == key]
    own = [s for s in states if same_lineage(s.tag, tag)]
    for old in prunable(own):
        old.path.unlink(missing_ok=True)
    steps = sorted({s.step for s in states if usable(s.tag)})
    if steps and steps[-1] == snapshot.step:
        _link_latest(
            stamped_path(directory, layers, snapshot.step, tag), checkpoint_path(directory, layers)
        )


def same_lineage(a: str | None, b: str | None) -> bool:
    """Are states of tags `a` and `b` of one lineage (one id, any epoch; None: the root)?"""
    return (a or "").partition("-e")[0] == (b or "").partition("-e")[0]


def prunable(states: list[SavedState], keep_steps: int = KEEP_STEPS) -> list[SavedState]:
    """Of one stage's states of one lineage, those older than its `keep_steps` newest steps."""
    steps = sorted({s.step for s in states})
    if len(steps) <= keep_steps:
        return []
    return [s for s in states if s.step < steps[-keep_steps]]


def _link_latest(target: Path, latest: Path) -> None:
    tmp = latest.with_name(f".{latest.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:  # no hard links here (or the target was pruned meanwhile): a copy
        try:
            shutil.copyfile(target, tmp)
        except OSError:
            return
    os.replace(tmp, latest)


def save_stage(
    path: Path, spec: RunSpec, model: Stage, optimizer: torch.optim.Optimizer, step: int
) -> None:
    """Atomically write the stage's state; `step` is the next step to run."""
    _write(path, spec, model, StageSnapshot(step, model.state_dict(), optimizer.state_dict()))


def _write(path: Path, spec: RunSpec, model: Stage, snapshot: StageSnapshot) -> None:
    meta = state_file.describe(
        spec.run_id,
        spec.data_sha256,
        dataclasses.asdict(model.config),
        model.layers,
        snapshot.step,
        snapshot.optimizer_state,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        os.close(fd)
        state_file.write(
            Path(tmp_name),
            meta,
            snapshot.model_state,
            snapshot.optimizer_state.get("state", {}),
            snapshot.outer_state,
        )
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


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
        state = torch.load(path, map_location="cpu", weights_only=True)
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
    """Validate a checkpoint and load it into `model` (and `optimizer`); return its step.
    `outer_state`, if given, gets the file's DiLoCo tensors (none: the file has no outer
    state); worker/averaging/outer_rounds.py checks them against the stage when it takes them."""
    state = read_file(path)
    problem = _check(state, spec, model)
    if problem:
        raise UserError(f"checkpoint {path} does not fit this stage: {problem}")
    model.load_state_dict(state["model_state"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer_state"])
    if outer_state is not None:
        outer_state.clear()
        outer_state.update(state.get("outer_state", {}))
    return int(state["step"])


def read_state(path: Path, spec: RunSpec, layers: range) -> dict[str, Any]:
    """A saved state of `layers`, validated as load_stage does, without a model to load it
    into (train/recut.py builds another stage from it)."""
    state = read_file(path)
    with torch.device("meta"):  # shapes only: no memory, no init
        shape = Stage(spec.model_config(), layers, spec.seed)
    problem = _check(state, spec, shape)
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
    if data and spec.data_sha256 and data != spec.data_sha256:
        return f"data digest {data!r}, expected {spec.data_sha256!r}"
    return None


_runs: dict[tuple[str, int, int, int, str], str | None] = {}


def other_run(path: Path, spec: RunSpec) -> str | None:
    """Why the state file at `path` is not of `spec`'s run (another run id, model shape or data
    digest, or unreadable), None if it is; remembered while the file is unchanged. A swarm
    adopts another lineage's state only if this is None (worker/resume/adopt.py)."""
    try:
        stat = path.stat()
    except OSError as exc:
        return f"gone: {exc.strerror}"
    run = f"{spec.run_id}|{spec.data_sha256}|{spec.model_config()!r}"
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, run)
    if key not in _runs:
        try:
            state = read_file(path)
            problem = (
                "not a p2ptrain stage checkpoint"
                if state.get("format") not in KNOWN_FORMATS
                else _other_run(state, spec)
            )
        except UserError as exc:
            problem = str(exc)
        if len(_runs) > 1024:
            _runs.clear()
        _runs[key] = problem
    return _runs[key]


def _check(state: Any, spec: RunSpec, model: Stage) -> str | None:
    if not isinstance(state, dict) or state.get("format") not in KNOWN_FORMATS:
        return "not a p2ptrain stage checkpoint"
    problem = _other_run(state, spec)
    if problem:
        return problem
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
