"""A stage state's sha256, the name peers announce and fetch a state by
(worker/resume/state_transfer.py): remembered while its file is unchanged, as a state is written
once, by rename, and announced at every plan.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from p2ptrain.durable import open_regular

_digests: dict[tuple[int, ...], str] = {}


def file_sha256(path: Path) -> str:
    """The sha256 (hex) of a file, remembered while the file is unchanged (states are written
    once, by rename, and announced at every plan). OSError if `path` holds no regular file
    (durable.NotRegularFile: a FIFO there hung the worker)."""
    with open_regular(path) as f:
        return open_sha256(f)


def open_sha256(f: BinaryIO) -> str:
    """The sha256 (hex) of an open file's bytes, read from its current position (its start),
    remembered by the file's identity and times (of the file hashed, not of whatever a name
    holds later; ctime too: it moves on any write, also one that set the mtime back)."""
    stat = os.fstat(f.fileno())
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if (known := _digests.get(key)) is None:  # one lookup: another thread may clear it
        digest = hashlib.sha256()
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
        if len(_digests) > 1024:
            _digests.clear()
        known = _digests[key] = digest.hexdigest()
    return known
