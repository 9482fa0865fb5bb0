"""The data plane's private temp folder: what hivemind, multiprocessing and torch leave in the
temp directory goes there, and goes with it.

Sending a hivemind future to another process starts multiprocessing's listener in a `pymp-*`
folder that only Python's exit handlers remove, and the worker ends with `os._exit`; hivemind
binds its Unix sockets as `/tmp/hivemind-p2pd-*.sock` and `-p2pclient-*.sock` (one more per
averager, never closed); torch's shared-memory manager makes `torch-shm-dir-*`. Every worker
exit left some, every SIGKILL all. So a worker (and the doctor's daemon check) points TMPDIR,
`tempfile` and hivemind's socket prefix into a 0700 folder of its own: `.worker-PID` beside its
IPC socket, in the node's IPC folder (node/ipc_dir.py: the supervisor removes it, the next start
sweeps it), or, without one or where a socket's path would be too long there,
`p2ptrain-worker-UID-PID` in the temp directory. The process removes its folder at exit; one
whose process is gone is swept by the next start of a worker, a node or the doctor's check, and
by a node's supervisor when it stops. Stdlib only at import: the supervisor sweeps with it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from p2ptrain.procs import make_pid_dir, sweep_pid_dirs

MAX_SOCKET_PATH_BYTES = 107  # Linux's sun_path holds 108 bytes, its NUL included
SOCKET_PREFIX = "hivemind-"  # hivemind's own: its sockets keep their names
# the longest path bound in the folder: hivemind's client socket (an 11-character token);
# multiprocessing's `pymp-XXXXXXXX/listener-XXXXXXXX` is shorter
LONGEST_NAME = f"{SOCKET_PREFIX}p2pclient-{'x' * 11}.sock"
_PID_MAX = 2**22
_INSIDE_PREFIX = ".worker-"


class PrivateTmp:
    """This process's temp folder (`path`), beside its IPC socket `ipc` where its sockets fit;
    `use` it before hivemind starts anything, `remove` it at exit."""

    def __init__(self, ipc: str | None = None) -> None:
        places = _places(ipc)
        for parent, prefix in places:
            sweep_pid_dirs(parent, prefix)
        parent, prefix = next(
            ((parent, prefix) for parent, prefix in places if _fits(parent / prefix)),
            places[-1],
        )
        self.path = make_pid_dir(parent, prefix)
        atexit.register(self.remove)  # an exit through Python's (os._exit calls `remove`)

    def use(self) -> None:
        """Point this process and its children there: TMPDIR (p2pd), `tempfile`
        (multiprocessing's listener) and hivemind's Unix sockets (the DHT and averager
        processes fork from us and keep the prefix); and keep shared tensors out of /dev/shm.
        Before hivemind is imported."""
        # hivemind shares tensors through named files in /dev/shm (its default strategy,
        # set as it is imported), which only torch's shared-memory manager unlinks: a killed
        # worker's process group left them, one as large as the stage's gradient buffer, for
        # good. Shared through descriptors, nothing is named: a crash leaves nothing.
        os.environ["HIVEMIND_MEMORY_SHARING_STRATEGY"] = "file_descriptor"
        from hivemind.p2p import P2P

        os.environ["TMPDIR"] = str(self.path)
        tempfile.tempdir = str(self.path)
        P2P._UNIX_SOCKET_PREFIX = f"/unix{self.path}/{SOCKET_PREFIX}"

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        atexit.unregister(self.remove)


def sweep_temp() -> list[Path]:
    """Remove the folders in the temp directory whose process is gone (a SIGKILLed worker's);
    those removed."""
    return [path for parent, prefix in _places(None) for path in sweep_pid_dirs(parent, prefix)]


def _places(ipc: str | None) -> list[tuple[Path, str]]:
    """(folder, name prefix) where the folder may go: beside the IPC socket, else the temp
    directory, else /tmp (a TMPDIR too long for a socket path)."""
    places = [(Path(os.path.abspath(ipc)).parent, _INSIDE_PREFIX)] if ipc else []
    for temp in (Path(tempfile.gettempdir()), Path("/tmp")):
        place = (temp, f"p2ptrain-worker-{os.getuid()}-")
        if place not in places:
            places.append(place)
    return places


def _fits(prefix_path: Path) -> bool:
    longest = prefix_path.parent / f"{prefix_path.name}{_PID_MAX}" / LONGEST_NAME
    return len(os.fsencode(longest)) <= MAX_SOCKET_PATH_BYTES
