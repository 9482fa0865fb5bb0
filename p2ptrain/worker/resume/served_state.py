"""A state file as the state server sends it (worker/resume/state_transfer.py, copy_server.py):
opened once, as a regular file, its sha256 taken from that descriptor and its bytes sent from it,
never reopened by name (a state renamed over, or pruned, between the check and the send was sent
under the checked digest: docs/security.md); and the pace its reader must keep (`Pace`).

No hivemind; the state server imports it, never the other way."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from p2ptrain.durable import open_regular
from p2ptrain.train.checkpoint_folder import layers_key, list_states
from p2ptrain.train.state_digest import open_sha256
from p2ptrain.train.state_file import ZIP_MAGIC

# A reader must take the state at a floor rate on average, with SEND_GRACE_S of its first
# seconds free: a reader that takes each chunk just before the stall cut (CHUNK_STALL_S, ~47 s a
# MiB: ~22 KiB/s) held one of the server's few slots until the send's deadline. The floor is
# a 1/slots share of the pace that ends the send at its deadline (state_transfer.py: the
# deadline gives twice the time at the plan's link rate, so with every slot busy each honest
# reader sharing our uplink gets twice the floor); the grace covers a relayed stream's start
# and TCP's slow start
SEND_GRACE_S = 15.0


class TooSlow(TimeoutError):
    """A reader that took the bytes under the floor rate: cut, as a stalled one is."""


@dataclass
class OpenedState:
    """A state file open for sending: `file` at its start, `size` and `digest` of its bytes;
    `pickled`: of an older format (torch.save's), never sent."""

    path: Path  # the name it was opened under: for the log only, never reopened
    file: BinaryIO
    size: int
    digest: str
    pickled: bool

    def close(self) -> None:
        self.file.close()


def open_state(path: Path) -> OpenedState:
    """`path` opened once (a regular file only: durable.NotRegularFile, an OSError, otherwise),
    its sha256 read from that descriptor (train/state_digest.py: remembered while the file is
    unchanged: hashing a large state is slow), and the descriptor back at its start. Blocking:
    run on a thread."""
    f = open_regular(path)
    try:
        digest = open_sha256(f)
        f.seek(0)
        pickled = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
        f.seek(0)
        return OpenedState(path, f, os.fstat(f.fileno()).st_size, digest, pickled)
    except BaseException:
        f.close()
        raise


def find_state(directory: Path, layers: range, step: int, digest: str) -> OpenedState | None:
    """`directory`'s stamped state of `layers` at `step` (of any lineage) whose bytes' sha256
    is `digest`, open (the caller closes it); the others looked at are closed. A name that is
    gone or holds no regular file is passed over. Blocking: run on a thread."""
    key = layers_key(layers)
    for state in list_states(directory):
        if state.key != key or state.step != step:
            continue
        with contextlib.suppress(OSError):
            opened = open_state(state.path)
            if opened.digest == digest:
                return opened
            opened.close()
    return None


class Pace:
    """The bytes a send's reader took, and when it began (`clock`: monotonic seconds), held
    to `floor_bps` (bytes a second) past the grace."""

    def __init__(self, clock: Callable[[], float], floor_bps: float) -> None:
        self._clock = clock
        self._start_s = clock()
        self.floor_bps = floor_bps
        self.sent = 0

    def took(self, size: int) -> None:
        """Count `size` more bytes taken; TooSlow if the reader is under the floor rate."""
        self.sent += size
        elapsed_s = self._clock() - self._start_s
        if self.sent < self.floor_bps * (elapsed_s - SEND_GRACE_S):
            raise TooSlow(
                f"the reader took {self.sent} bytes in {elapsed_s:.0f} s: under "
                f"{self.floor_bps:.0f} bytes/s past its first {SEND_GRACE_S:.0f} s"
            )
