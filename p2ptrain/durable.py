"""Files that survive a power cut whole: a name is made durable only after the bytes it names
(a state's name is announced as a promise of its bytes; an identity's key is its peer id).
And files of a folder we keep (a checkpoint folder) opened for reading only as what they claim
to be: a regular file, never a FIFO, device or symlink put in their place (`open_regular`).
Light: no torch, so the key file and the checkpoints share it."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

# O_NONBLOCK: a FIFO opens at once (a plain open waits for a writer forever), then fails the
# fstat; O_NOFOLLOW: a symlink planted under a state's name is not followed
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_PROC_FDS = Path("/proc/self/fd")


class NotRegularFile(OSError):
    """A name that holds no regular file of its own: a FIFO, device, socket, directory, or a
    symbolic link (never followed). An OSError, so a caller's handling of an unreadable file
    covers it."""


def open_regular(path: str | Path, follow_symlinks: bool = False) -> BinaryIO:
    """`path` opened for reading if it is a regular file; NotRegularFile otherwise (OSError
    for a missing or unreadable one). Never blocks. A symlink is refused unless
    `follow_symlinks` (a run's data file named directly: train/data.py)."""
    nofollow = 0 if follow_symlinks else _NOFOLLOW
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _NONBLOCK | nofollow)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):  # O_NOFOLLOW's refusal
            raise NotRegularFile(errno.ELOOP, "a symbolic link, not followed", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        if _NONBLOCK:
            os.set_blocking(fd, True)  # a regular file's reads never block; clear it anyway
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def fd_path(fd: int) -> str | None:
    """A name that opens the very file `fd` is open on (Linux: /proc/self/fd/N), for a library
    that opens files only by name (safetensors): the name it was checked under could be swapped
    meanwhile. None where the system has none (the caller then opens by name: a check-then-open)."""
    return str(_PROC_FDS / str(fd)) if _PROC_FDS.is_dir() else None


def durable_replace(tmp: str | Path, path: Path, fd: int | None = None) -> None:
    """Rename the written file `tmp` to `path` so that a power cut leaves one or the other,
    never an empty or zeroed `path`: its bytes reach the disk before the rename, and the
    rename before the caller goes on. `fd`: the descriptor `tmp` was written through (synced
    as it is: nothing is reopened by name)."""
    if fd is not None:
        os.fsync(fd)
    else:
        with open_regular(tmp) as f:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_directory(path.parent)


def link_into_place(source: Path, path: Path, prefix: str, suffix: str) -> None:
    """Make `path` name `source`'s bytes, atomically and durably: a hard link under a fresh
    temporary name `prefix`+random+`suffix` beside `path` (a copy into a new 0600 file of our own
    where there are no hard links), renamed over `path`. Neither ever writes through a name
    someone else made: a link fails on an existing name, the copy's file is mkstemp's (O_EXCL).
    OSError if neither can be made (the source gone, a FIFO or symlink in its place)."""
    if not stat.S_ISREG(os.lstat(source).st_mode):  # a link would name a FIFO, or a symlink
        raise NotRegularFile(errno.EINVAL, "not a regular file", str(source))
    link = path.with_name(f"{prefix}{secrets.token_hex(4)}{suffix}")
    try:
        os.link(source, link, follow_symlinks=False)
    except OSError:  # no hard links here, the source gone, or the name taken: a copy
        _copy_into_place(source, path, prefix, suffix)
        return
    try:
        durable_replace(link, path)
    except BaseException:
        link.unlink(missing_ok=True)
        raise


def _copy_into_place(source: Path, path: Path, prefix: str, suffix: str) -> None:
    with open_regular(source) as src:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
        try:
            with open(fd, "wb", closefd=False) as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
            durable_replace(tmp, path, fd)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)


def sync_directory(directory: Path) -> None:
    """Make the renames and links made in `directory` durable (where a directory can be
    opened and synced: not on Windows, nor on some network file systems)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
