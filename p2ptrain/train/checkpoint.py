"""Stage checkpoints: weights, optimizer state and step of one contiguous layer range; writing
them and keeping each stage's history of them.

One file per state, a safetensors file (format /3, train/state_file.py): the weights and AdamW's
moments as tensors, and the metadata (format, run, model config, layers, step, the optimizer's
hyperparameters) as JSON in its header; nothing in it is unpickled (docs/security.md, 26.7). One
file, not a weights file beside an optimizer file, because a state moves between peers by its
one digest (worker/resume/state_transfer.py) and is written atomically by one rename. The file names
keep their `.pt` ending. Reading a file back, older formats and the checks before it touches a
model are train/checkpoint_read.py's; a state's digest is train/state_digest.py's, the bounds on
its size train/state_bounds.py's.

A file is named by its layer range, not by the peer that wrote it, so any peer later assigned the
same stage can load it (train/checkpoint_folder.py: the folder's names, listing, sweeping torn
writes). Writes are atomic (temp file + rename) because replicas of a stage on one machine may
write the same file, and durable (the file fsynced before its rename, the directory
after: durable.py), so that a power cut cannot leave a renamed state empty or zeroed.

History: `stage-L{a}-{b}.step{N}.{tag}.pt` keeps the stage's state at the last few step
boundaries (KEEP_STEPS), and `stage-L{a}-{b}.pt` is a hard link to the newest. A swarm switching
to a new plan restarts every stage from one common step (worker/resume/start_step.py); the stages of a
pipeline can be one step apart when a plan interrupts them, so each must be able to go one step
back. The tag names the plan lineage the state was saved under (records/lineage.py: a plan uses
only states of its own lineage or its ancestors'); a state of the root lineage (saved under a
plan without a lineage, or before lineages existed) has none: `stage-L{a}-{b}.step{N}.pt`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from p2ptrain.durable import durable_replace, link_into_place
from p2ptrain.records import lineage as lin
from p2ptrain.records.run import RunSpec
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint_folder import (
    SavedState,
    checkpoint_path,
    layers_key,
    list_states,
    stamped_path,
    unfinished_prefix,
)
from p2ptrain.train.checkpoint_read import other_run
from p2ptrain.train.model import Stage
from p2ptrain.train.snapshot import StageSnapshot

log = logging.getLogger(__name__)

KEEP_STEPS = 4  # stamped files kept per stage


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
    and keep the KEEP_STEPS newest steps of that history: the writer's own lineage and its
    ancestors are one history (a new term's lineage goes on from its parent's states), so their
    older files go; files of every other lineage stay (another swarm's or another half's progress
    is not ours to delete: `p2ptrain checkpoints prune` removes them). Without the ancestors in
    the count, every planner change left KEEP_STEPS files a stage behind for good."""
    layers = model.layers
    _write(stamped_path(directory, layers, snapshot.step, tag), spec, model, snapshot)
    key = layers_key(layers)
    states = prune_history(directory, key, snapshot.step, tag, usable, spec)
    _prune_earlier_cuts(
        directory,
        layers,
        lambda s: (same_lineage(s.tag, tag) or usable(s.tag)) and of_run(s, spec),
    )
    # newest by the same order: by step alone, a restart below the earlier epochs' steps left
    # the latest file on a state its own pruning then deleted
    path = stamped_path(directory, layers, snapshot.step, tag)
    newer = _newer_in(tag)
    mine = max((newer(s) for s in states if s.path == path), default=None)
    if mine is not None and all(newer(s) <= mine for s in states if usable(s.tag)):
        _link_latest(path, checkpoint_path(directory, layers))


def prune_history(
    directory: Path,
    key: str,
    step: int,
    tag: str | None,
    usable: Callable[[str | None], bool],
    spec: RunSpec | None = None,
) -> list[SavedState]:
    """After a state of stage `key` at `step` was stored under lineage `tag`: keep the
    KEEP_STEPS newest of its history (the lineage and its ancestors, `usable`, of `spec`'s run:
    `of_run`); the stage's states as they were before, for the caller's latest link."""
    states = [s for s in list_states(directory) if s.key == key]
    # an ancestor's states past the step just written stay: a lineage that restarted below them
    # (stages that shared no step: worker/resume/start_step.py) would prune what it just wrote
    history = [
        s
        for s in states
        if (same_lineage(s.tag, tag) or (usable(s.tag) and s.step <= step)) and of_run(s, spec)
    ]
    for old in prunable(history, newer=_newer_in(tag)):
        old.path.unlink(missing_ok=True)
    return states


def _newer_in(tag: str | None) -> Callable[[SavedState], tuple[bool, int, int]]:
    """Newest by the plans states were written under, then by step, lineage `tag`'s first: a
    lineage that restarted below its own earlier epochs' steps (a rejoining replica's common
    step) keeps what it writes now, and the earlier epochs' higher steps go first."""
    return lambda state: (same_lineage(state.tag, tag), *written(state))


def _prune_earlier_cuts(
    directory: Path, layers: range, in_history: Callable[[SavedState], bool]
) -> None:
    """States of this history's earlier cuts (another layer range) whose blocks all lie in
    `layers`, once `layers` holds KEEP_STEPS steps and they are older than all it holds: the
    stage holds their blocks at later steps, as many steps back as it keeps of its own. Ranges
    with blocks outside `layers` stay (they may be the only copy of those blocks: a re-cut
    builds from them), as do other lineages' states. Each re-cut used to leave KEEP_STEPS full
    states behind for good."""
    states = [s for s in list_states(directory) if in_history(s)]
    own = sorted({s.step for s in states if s.key == layers_key(layers)})
    if len(own) < KEEP_STEPS:
        return
    # the oldest step it holds (past KEEP_STEPS only when a lineage restarted below its
    # ancestors' steps, which stay until it passes them)
    oldest_kept = own[0]
    emptied = set()
    for state in states:
        covered = _key_layers(state.key)
        if (
            state.key != layers_key(layers)
            and covered.start >= layers.start
            and covered.stop <= layers.stop
            and state.step < oldest_kept
        ):
            state.path.unlink(missing_ok=True)
            emptied.add(covered)
    held = {s.key for s in list_states(directory)}
    for covered in emptied:  # its latest link would hold a pruned state's bytes for good
        if layers_key(covered) not in held:
            checkpoint_path(directory, covered).unlink(missing_ok=True)


def of_run(state: SavedState, spec: RunSpec | None) -> bool:
    """May a writer of `spec`'s run count `state` in its history? An untagged state (the root's,
    which every plan descends from) in a shared directory may be another run's: never ours."""
    return spec is None or state.tag is not None or other_run(state.path, spec) is None


def _key_layers(key: str) -> range:
    start, _, stop = key[1:].partition("-")
    return range(int(start), int(stop))


def same_lineage(a: str | None, b: str | None) -> bool:
    """Are states of tags `a` and `b` of one lineage (one id, any epoch; None: the root)?"""
    return (a or "").partition("-e")[0] == (b or "").partition("-e")[0]


def written(state: SavedState) -> tuple[int, int]:
    """When a state of one lineage was written, as an order: its plan's epoch, then its step
    (an untagged state: epoch -1)."""
    parsed = lin.parse_tag(state.tag) if state.tag is not None else None
    return (-1 if parsed is None else parsed[1], state.step)


def prunable(
    states: list[SavedState],
    keep_steps: int = KEEP_STEPS,
    newer: Callable[[SavedState], tuple[Any, ...]] = written,
) -> list[SavedState]:
    """Of one stage's states of one lineage, those of steps older than its `keep_steps`
    newest, newest by `newer` (a later epoch's step before an earlier epoch's higher one)."""
    newest: dict[int, tuple[Any, ...]] = {}
    for state in states:
        order = newer(state)
        newest[state.step] = max(newest.get(state.step, order), order)
    if len(newest) <= keep_steps:
        return []
    kept = set(sorted(newest, key=lambda step: newest[step])[-keep_steps:])
    return [s for s in states if s.step not in kept]


def _link_latest(target: Path, latest: Path) -> None:
    # a fresh temporary name (a copy into mkstemp's file where there are no hard links): a
    # symlink planted at the fixed name it had was written through
    try:
        link_into_place(target, latest, f".{latest.name}.{os.getpid()}.", ".link")
    except OSError as exc:  # the target pruned meanwhile, or no room for a copy
        log.debug("%s not linked to %s: %s", latest.name, target.name, exc)


def save_stage(
    path: Path, spec: RunSpec, model: Stage, optimizer: torch.optim.Optimizer, step: int
) -> None:
    """Atomically write the stage's state; `step` is the next step to run."""
    _write(path, spec, model, StageSnapshot(step, model.state_dict(), optimizer.state_dict()))


def _write(path: Path, spec: RunSpec, model: Stage, snapshot: StageSnapshot) -> None:
    snapshot = snapshot.settled()  # a GPU's copies into it have landed
    meta = state_file.describe(
        spec.run_id,
        spec.data.data_sha256,
        dataclasses.asdict(model.config),
        model.layers,
        snapshot.step,
        snapshot.optimizer_state,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=unfinished_prefix(path), suffix=".tmp")
    try:
        os.close(fd)
        state_file.write(
            Path(tmp_name),
            meta,
            snapshot.model_state,
            snapshot.optimizer_state.get("state", {}),
            snapshot.outer_state,
        )
        durable_replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
