"""The node's IPC socket folder lies beside its identity, private, and goes away: at exit, or
(after a SIGKILL) at the next start with that identity; nothing in the system temp dir."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

from p2ptrain.node.ipc_dir import MAX_SOCKET_PATH_BYTES, IpcDir


def a_dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def listens(path: str) -> bool:
    """A Unix socket can be bound at `path` (and is removed again)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
    os.unlink(path)
    return True


def test_the_folder_lies_beside_the_identity_private_and_goes_away(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    ipc = IpcDir(key)
    assert ipc.directory == tmp_path / f".node.key.ipc-{os.getpid()}"
    assert stat.S_IMODE(ipc.directory.stat().st_mode) == 0o700
    assert listens(ipc.path)
    ipc.remove()
    assert list(tmp_path.iterdir()) == []


def test_what_a_killed_node_left_is_swept_by_the_next_start(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    stale = tmp_path / f".node.key.ipc-{a_dead_pid()}"  # a SIGKILLed supervisor's
    stale.mkdir(mode=0o700)
    (stale / "control.sock").touch()
    running = tmp_path / ".node.key.ipc-1"  # a live process's (pid 1): maybe a node's
    running.mkdir()
    other = tmp_path / ".other.key.ipc-999999999"  # another identity's: not this one's
    other.mkdir()
    ipc = IpcDir(key)
    assert not stale.exists() and running.exists() and other.exists()
    ipc.remove()


def test_an_identity_too_deep_for_a_socket_path_uses_the_temp_dir_and_sweeps_it(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    temp = Path(tempfile.gettempdir())
    stale = temp / f"p2ptrain-ipc-{os.getuid()}-{a_dead_pid()}"
    stale.mkdir(exist_ok=True)
    ipc = IpcDir(deep / "node.key")
    try:
        assert ipc.directory == temp / f"p2ptrain-ipc-{os.getuid()}-{os.getpid()}"
        assert len(os.fsencode(ipc.path)) <= MAX_SOCKET_PATH_BYTES and listens(ipc.path)
        assert not stale.exists()
    finally:
        ipc.remove()
    assert not ipc.directory.exists()
