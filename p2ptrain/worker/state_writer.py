"""A stage's checkpoints written beside its training, where that hides them.

A periodic save (Session.save) hands host copies of the stage's state (train/checkpoint.py's
StageSnapshot: what every step already takes of the state one step back) to a thread that
serializes and writes them while the next steps train. On a GPU node the host CPU that does it
is otherwise idle, and serializing and writing a large model's state takes seconds. On a CPU
device the thread would take its CPU from the steps themselves (measured on bench scaleout's
workers, each 1/8 of a core: a save of 0.02 s of CPU at a whole core took 0.5-1.7 s beside the
steps and made the step it fell in twice the median), so there a save writes in place
(`beside=False`), between two steps.

At most one write is in flight: a save that finds the previous write unfinished waits for it
(saves are `checkpoint_interval` steps apart, so it rarely does), which keeps the states landing
in step order and at most one set of copies in memory. A session's last save (close) waits for
the write in flight and then writes in the calling thread, so everything it saved is on disk
before the worker announces its states to a new plan's start agreement
(worker/resume/start_step.py). A failed write (disk full, directory gone), beside, in place or
a session's last, is logged and training goes on: the next save tries again, and the agreement
announces what is on disk. A writer killed mid-write
leaves its temporary file; the next session's writer deletes those of writers that are gone
(train/checkpoint_folder.py's sweep_unfinished).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from p2ptrain.records import RunSpec
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import sweep_unfinished
from p2ptrain.train.model import Stage
from p2ptrain.train.snapshot import StageSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateWrite:
    """What one save writes: the stage's states, oldest first, under lineage `tag` (`usable`:
    which lineages' states the stage's latest file may point at; train/checkpoint.py)."""

    model: Stage  # read for its layers and config only
    snapshots: tuple[StageSnapshot, ...]
    tag: str | None
    usable: Callable[[str | None], bool]

    def run(self, directory: Path, spec: RunSpec) -> None:
        for snapshot in self.snapshots:
            record_step(directory, spec, self.model, snapshot, self.tag, self.usable)


class StateWriter:
    """The checkpoint writes of one session's stage into `directory`, one at a time."""

    def __init__(self, directory: Path, spec: RunSpec, beside: bool = True) -> None:
        self.directory = directory
        self.spec = spec
        self.beside = beside  # False: every write in the calling thread
        self._thread: threading.Thread | None = None
        freed = sweep_unfinished(directory)  # what writers killed mid-write left, state-sized
        if freed:
            log.info("checkpoint: removed %.1f MB of torn writes of crashed writers", freed / 1e6)

    def submit(self, write: StateWrite) -> None:
        """A periodic save: written in the background (after the previous write, if still
        running), or here if not `beside`; either way a failure is logged, not raised."""
        self.wait()
        if not self.beside:
            self._run(write)
            return
        step = write.snapshots[-1].step
        self._thread = threading.Thread(
            target=self._run, args=(write,), name=f"state-writer-{step}", daemon=True
        )
        self._thread.start()

    def write_now(self, write: StateWrite) -> None:
        """Write in the calling thread, after the write in flight: on disk when this returns,
        unless it failed (logged, as a write beside training: a full disk at a session's end
        ended the worker, and the next session never started)."""
        self.wait()
        self._run(write, beside=False)

    def wait(self) -> None:
        """Until the write in flight (if any) has ended."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    @property
    def writing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, write: StateWrite, beside: bool | None = None) -> None:
        step = write.snapshots[-1].step
        started = time.monotonic()
        try:
            write.run(self.directory, self.spec)
        except Exception:  # a lost checkpoint must not end training
            log.exception("checkpoint: step %d not written (training goes on)", step)
            return
        log.info(
            "checkpoint: step %d -> %s (written in %.2f s%s)",
            step,
            self.directory,
            time.monotonic() - started,
            " beside training" if (self.beside if beside is None else beside) else "",
        )
