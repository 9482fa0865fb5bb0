"""The checkpoint folder: where a run's stage states live, the names of their files, and which
states it holds (train/checkpoint.py writes them).

A file is named by its layer range, not by the peer that wrote it, so any peer later assigned the
same stage can load it: `stage-L{a}-{b}.pt` is the stage's latest state, and
`stage-L{a}-{b}.step{N}.{tag}.pt` (`.step{N}.pt` in the root lineage) its state at step N, so
the folder's states are listed from their names alone. A state is written (or fetched) under a
temporary name with its writer's pid in it first: a SIGKILL between its first byte and its
rename leaves a torn file as large as the state, which `sweep_unfinished` deletes.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from p2ptrain.procs import pid_alive
from p2ptrain.records.run import RunSpec

# a state being written (or fetched) under its final name plus ".{pid}.{random}.tmp|part"
# (before pids were in the name, plus "{random}.tmp|part"), and a latest link being made
# (".{name}.{pid}.{random}.link"; before the random part, ".{name}.{pid}.link")
_UNFINISHED = re.compile(
    r"^stage-L[0-9]+-[0-9]+(?:\.step[0-9]+(?:\.[0-9a-f]{16}-e[0-9]{1,16})?)?\.pt"
    r"(?:\.([0-9]{1,10})\.)?[a-z0-9_]*\.(?:tmp|part)$"
    r"|^\.stage-L[0-9]+-[0-9]+\.pt\.([0-9]{1,10})\.(?:[a-z0-9_]{1,16}\.)?link$"
    # an adopted state's link or copy (worker/resume/adopt.py: _link): a full copy without hard links
    r"|^\.stage-L[0-9]+-[0-9]+\.step[0-9]+(?:\.[0-9a-f]{16}-e[0-9]{1,16})?\.pt"
    r"\.([0-9]{1,10})\.(?:[a-z0-9_]{1,16}\.)?adopt$"
)
DEAD_WRITER_AGE_S = 60.0  # an unfinished file of a dead writer untouched this long is torn
STALE_AGE_S = 3600.0  # any unfinished file untouched this long is torn (writers keep writing)
_STAMPED = re.compile(
    r"^stage-L([0-9]+)-([0-9]+)\.step([0-9]+)(?:\.([0-9a-f]{16}-e[0-9]{1,16}))?\.pt$"
)


def checkpoint_dir(spec: RunSpec) -> Path:
    """Where the run's checkpoints live: spec.checkpoint.checkpoint_dir or runs/<run_id>/checkpoints."""
    return Path(spec.checkpoint.checkpoint_dir or os.path.join("runs", spec.run_id, "checkpoints"))


def checkpoint_path(directory: Path, layers: range) -> Path:
    return directory / f"stage-L{layers.start}-{layers.stop}.pt"


def unfinished_prefix(path: Path) -> str:
    """The start of the temporary name a state is written (or fetched) under before its rename
    to `path`: the writer's pid in it tells a crashed writer's torn file from one being written."""
    return f"{path.name}.{os.getpid()}."


def sweep_unfinished(directory: Path, now: float | None = None) -> int:
    """Delete the torn writes crashed writers left in `directory` (a SIGKILL between a state's
    first byte and its rename leaves a file as large as the state): those of a writer that is
    gone, and any untouched for an hour. The bytes freed."""
    now = time.time() if now is None else now
    freed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        match = _UNFINISHED.fullmatch(name)
        if match is None:
            continue
        path = directory / name
        try:
            stat = path.stat()
        except OSError:
            continue
        age = now - stat.st_mtime
        pid = match[1] or match[2] or match[3]
        writer_gone = pid is not None and not pid_alive(int(pid))
        if age >= STALE_AGE_S or (writer_gone and age >= DEAD_WRITER_AGE_S):
            with contextlib.suppress(OSError):
                path.unlink()
                freed += stat.st_size
    return freed


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
        match = _STAMPED.fullmatch(name)
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
