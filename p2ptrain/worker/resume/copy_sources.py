"""Which of a checkpoint directory's states are a spare's copies, and of whose (worker/resume/copies.py).

A copy is worth announcing only when the peer it was copied from is gone: while that holder is a
member of the plan, it announces the same state and newer ones itself, and the copy, older and
held by someone the plan may place at the stage, would only hold the stage back to the copy's
step (the start agreement trusts a lone newer state only where nobody else holds those blocks
or the plan places its announcer there: start_choice.py, covers.py). So a copy's file name and its
holder are kept in `copies.json` beside the states, and a member leaves out of its announcement
the copies whose holder the plan names (`without_live_sources`).

The file is this machine's own bookkeeping, but read defensively like any file: anything but a
JSON object of short strings reads as no copies (the states are then announced as the
member's own, the worst case a start held back to a copy's step).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Collection
from pathlib import Path

from p2ptrain.durable import open_regular
from p2ptrain.train.checkpoint_folder import SavedState, list_states, stamped_path
from p2ptrain.worker.resume.announcement import Announced
from p2ptrain.worker.resume.covers import key_range

FILE_NAME = "copies.json"
_LOCK = threading.Lock()  # written from the transport's loop (a copy) and the worker's thread
MAX_BYTES = 64 * 1024  # a few entries: a spare keeps copies of one stage, 4 steps of it
MAX_NAME = 200


def read_sources(directory: Path) -> dict[str, str]:
    """State file name -> the peer it was copied from ({} if none, unreadable, or no regular
    file: a FIFO or symlink under its name)."""
    try:
        with open_regular(directory / FILE_NAME) as f:  # a FIFO there hung the worker's start
            raw = f.read(MAX_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        name: peer
        for name, peer in data.items()
        if isinstance(peer, str) and len(name) <= MAX_NAME and len(peer) <= MAX_NAME
    }


def record_copy(directory: Path, name: str, holder: str | None) -> None:
    """Note that the state file `name` is (about to be) a copy of `holder`'s (None: forget it, a
    copy that did not land): written before the file, so a crash between the two never leaves
    a copy taken for our own. Entries whose file is gone go, but this one."""
    with _LOCK:
        present = {state.path.name for state in list_states(directory)} | {name}
        sources = {n: peer for n, peer in read_sources(directory).items() if n in present}
        if holder is None:
            sources.pop(name, None)
        else:
            sources[name] = holder
        _write(directory, sources)


def drop_copies(directory: Path, keep: Callable[[SavedState, str], bool]) -> int:
    """Delete the copies `keep` refuses (given the state and its holder), and forget those
    whose file is gone: how many files went."""
    with _LOCK:
        sources = read_sources(directory)
        present = {state.path.name: state for state in list_states(directory)}
        gone = [
            state
            for name, state in present.items()
            if name in sources and not keep(state, sources[name])
        ]
        for state in gone:
            state.path.unlink(missing_ok=True)
        kept = {n: p for n, p in sources.items() if n in present and present[n] not in gone}
        if kept != sources:
            _write(directory, kept)
        return len(gone)


def _write(directory: Path, sources: dict[str, str]) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{FILE_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(sources, f, sort_keys=True)
        os.replace(tmp, directory / FILE_NAME)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def without_live_sources(
    announced: Announced, directory: Path, members: Collection[str]
) -> Announced:
    """`announced` less the copies whose holder is one of `members` (the plan's peers)."""
    sources = read_sources(directory)
    live = set(members)
    if not sources or not live & set(sources.values()):
        return announced
    kept: Announced = {}
    for key, steps in announced.items():
        layers = key_range(key)
        for step, (digest, tag) in steps.items():
            name = None if layers is None else stamped_path(directory, layers, step, tag).name
            if sources.get(name or "") not in live:
                kept.setdefault(key, {})[step] = (digest, tag)
    return kept
