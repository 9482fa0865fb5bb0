"""One node per identity: a second `join` or `bootstrap` with an identity a live node uses is
refused at its start.

Two nodes with one identity announce one peer id from two places, and their workers write one
checkpoint directory (each prunes and links the other's files). A script started a second one
by mistake, and both ran fully. The supervisor holds an exclusive `flock` on `.NAME.lock`
beside the identity file for its life; the kernel releases it when the process ends, however
it ends (a SIGKILL too), so a crash never leaves a stale lock. The file holds the holder's PID,
for the refusal's message. The worker holds it too (`fd`, passed to it): a supervisor killed
hard leaves its worker saving its stage for up to 30 s (worker/watchdog.py), and a node
restarted meanwhile would share its peer id and checkpoints.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from p2ptrain.errors import UserError

# O_NOFOLLOW: a symlink planted under the lock's name had its target truncated to our PID;
# O_NONBLOCK: a FIFO there opens at once, then fails the fstat
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def _open_own(path: Path) -> int:
    """The lock file opened for writing: a regular file of ours, else a one-line UserError."""
    try:
        fd = os.open(path, _FLAGS, 0o600)
    except OSError as exc:
        what = "a symbolic link" if path.is_symlink() else exc.strerror or exc
        raise UserError(f"cannot open the identity lock {path}: {what}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else "another user's file"
        raise UserError(
            f"cannot use the identity lock {path}: {what} (remove it; the node makes its own)"
        )
    os.set_blocking(fd, True)
    return fd


class IdentityLock:
    """Held from construction until `release` (or the process's end)."""

    def __init__(self, identity_path: str | os.PathLike[str]) -> None:
        key = Path(identity_path).resolve()
        self.path = key.parent / f".{key.name}.lock"
        fd = _open_own(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: another live node
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UserError(
                f"another node runs with identity {identity_path} (process {holder}, or its "
                "worker, still stopping): one identity, one node (they would share a peer id "
                "and a checkpoint directory)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd: int | None = fd

    @property
    def fd(self) -> int:
        """The locked descriptor: a child that keeps it open holds the lock as long as it lives."""
        assert self._fd is not None, "released"
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
