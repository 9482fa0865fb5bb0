"""Where a node's control and worker processes meet: the 0700 folder of their IPC socket.

Beside the identity file (`.NAME.ipc-PID`, PID the supervisor's), never a fresh folder in the
system temp directory, where every SIGKILLed node used to leave one behind (issue 26): removed at
exit, and one a SIGKILL left is swept by the next start with the same identity (its PID is dead),
as identity.py does for p2pd's key copy. Where that path is too long for a Unix socket, the
folder goes to the temp directory under a name with our uid and PID (`p2ptrain-ipc-UID-PID`),
swept there the same way. The worker keeps its temp files and hivemind's sockets in a folder
inside, or in the temp directory where their paths would be too long here
(worker/private_tmp.py): a supervisor sweeps those of dead workers as it starts and stops, so
that one a SIGKILLed worker left goes with its node. A folder, not an abstract socket: an
abstract name has no permissions, so any local user could connect, or bind the name while the
control process restarts and hand our worker plans.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from p2ptrain.procs import make_pid_dir, sweep_pid_dirs
from p2ptrain.worker import private_tmp

SOCKET_NAME = "control.sock"
MAX_SOCKET_PATH_BYTES = 107  # Linux's sun_path holds 108 bytes, its NUL included


class IpcDir:
    """The socket folder of this supervisor (`path`: the socket's path); `remove` at exit."""

    def __init__(self, identity_path: str | os.PathLike[str]) -> None:
        places = _places(Path(identity_path))
        for parent, prefix in places:
            sweep_pid_dirs(parent, prefix)
        private_tmp.sweep_temp()
        parent, prefix = next(
            ((parent, prefix) for parent, prefix in places if _fits(parent / prefix)),
            places[-1],
        )
        self.directory = make_pid_dir(parent, prefix)
        self.path = str(self.directory / SOCKET_NAME)

    def remove(self) -> None:
        """At exit, once the worker is gone: its temp folder goes too, wherever it was."""
        shutil.rmtree(self.directory, ignore_errors=True)
        private_tmp.sweep_temp()


def _places(identity_path: Path) -> list[tuple[Path, str]]:
    """(folder, name prefix) where a node of this identity may keep its socket folder: beside
    the identity, else (a path too long for a socket) the temp directory."""
    key = identity_path.resolve()
    temp = (Path(tempfile.gettempdir()), f"p2ptrain-ipc-{os.getuid()}-")
    return [(key.parent, f".{key.name}.ipc-"), temp]


def _fits(prefix_path: Path) -> bool:
    longest = prefix_path.parent / f"{prefix_path.name}{2**22}" / SOCKET_NAME  # pid_max
    return len(os.fsencode(longest)) <= MAX_SOCKET_PATH_BYTES
