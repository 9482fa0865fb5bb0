"""Files that survive a power cut whole: a name is made durable only after the bytes it names
(a state's name is announced as a promise of its bytes; an identity's key is its peer id).
Light: no torch, so the key file and the checkpoints share it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def durable_replace(tmp: str | Path, path: Path) -> None:
    """Rename the written file `tmp` to `path` so that a power cut leaves one or the other,
    never an empty or zeroed `path`: its bytes reach the disk before the rename, and the
    rename before the caller goes on."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Make the renames and links made in `directory` durable (where a directory can be
    opened and synced: not on Windows, nor on some network file systems)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
