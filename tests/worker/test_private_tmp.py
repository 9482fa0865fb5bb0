"""The worker's temp files and hivemind's sockets go to a folder of its own, inside the node's IPC
folder where their paths fit (else the temp dir), and go with it: at exit, or swept once its
process is gone (worker/private_tmp.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2ptrain.node.ipc_dir import IpcDir
from p2ptrain.worker.private_tmp import LONGEST_NAME, MAX_SOCKET_PATH_BYTES, PrivateTmp
from tests.test_ipc_dir import a_dead_pid

TEMP = Path(tempfile.gettempdir())
UID = os.getuid()

# in a child process, as the worker: hivemind is imported there (never beside py-libp2p), and
# pickling a pipe's end, as hivemind does with its futures, starts multiprocessing's listener
WORKER = """
import json, multiprocessing, os, sys, tempfile
from multiprocessing.reduction import ForkingPickler
from multiprocessing.util import get_temp_dir
from hivemind.p2p import P2P
from p2ptrain.worker.private_tmp import PrivateTmp
private = PrivateTmp(sys.argv[1] or None)
private.use()
ForkingPickler.dumps(multiprocessing.Pipe()[0])
print(json.dumps({"path": str(private.path), "mp": get_temp_dir(), "TMPDIR": os.environ["TMPDIR"],
    "tempfile": tempfile.gettempdir(), "prefix": P2P._UNIX_SOCKET_PREFIX}), flush=True)
os._exit(0)  # as the worker leaves: no exit handler runs
"""


def run_worker(ipc: str | None) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, ipc or ""], capture_output=True, check=True, timeout=60
    )
    result: dict[str, str] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return result


@pytest.fixture
def short_path() -> Iterator[Path]:
    """A folder whose path leaves room for the worker's sockets (pytest's tmp_path is deep)."""
    path = Path(tempfile.mkdtemp(prefix="p2pt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_worker_keeps_its_temp_files_and_sockets_inside_the_ipc_folder(short_path: Path) -> None:
    ipc = IpcDir(short_path / "node.key")
    try:
        seen = run_worker(ipc.path)
        private = Path(seen["path"])
        assert private.parent == ipc.directory and private.name.startswith(".worker-")
        assert Path(seen["mp"]).parent == private  # multiprocessing's pymp-* folder
        assert seen["TMPDIR"] == seen["tempfile"] == str(private)
        assert seen["prefix"] == f"/unix{private}/hivemind-"
        longest = private / LONGEST_NAME  # hivemind's client socket, at its longest
        assert len(os.fsencode(longest)) <= MAX_SOCKET_PATH_BYTES
        assert Path(seen["mp"]).is_dir()  # os._exit: nothing removed it...
    finally:
        ipc.remove()
    assert not ipc.directory.exists()  # ...but it goes with the node's folder


def test_too_deep_for_a_socket_or_without_an_ipc_folder_it_goes_to_the_temp_dir(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    for ipc in (str(deep / "control.sock"), None):
        private = PrivateTmp(ipc)
        try:
            assert private.path == TEMP / f"p2ptrain-worker-{UID}-{os.getpid()}"
            assert oct(private.path.stat().st_mode & 0o777) == "0o700"
        finally:
            private.remove()
        assert not private.path.exists()
    assert list(deep.iterdir()) == []


def test_what_a_killed_worker_left_is_swept_by_the_next_start_and_by_its_node(
    tmp_path: Path,
) -> None:
    dead_inside = tmp_path / f".worker-{a_dead_pid()}"
    live_inside = tmp_path / ".worker-1"  # pid 1: alive
    dead_in_temp = TEMP / f"p2ptrain-worker-{UID}-{a_dead_pid()}"
    for folder in (dead_inside, live_inside, dead_in_temp):
        folder.mkdir()
    private = PrivateTmp(str(tmp_path / "control.sock"))  # a worker's start
    private.remove()
    assert not dead_inside.exists() and not dead_in_temp.exists() and live_inside.exists()
    dead_in_temp.mkdir()
    ipc = IpcDir(tmp_path / "node.key")  # a node's start
    assert not dead_in_temp.exists()
    dead_in_temp.mkdir()  # the worker was SIGKILLed: its supervisor stops
    ipc.remove()
    assert not dead_in_temp.exists()


# as the worker: PrivateTmp.use() first, then hivemind; a shared tensor as hivemind's
# averager shares its buffer, then a SIGKILL's kind of exit
SHARED = """
import json, os, sys
from p2ptrain.worker.private_tmp import PrivateTmp
PrivateTmp(None).use()
import hivemind, torch
buffer = torch.zeros(1 << 16).share_memory_()
named = [n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{os.getpid()}_")]
print(json.dumps({"strategy": torch.multiprocessing.get_sharing_strategy(), "named": named}))
os._exit(0)
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm here")
def test_a_workers_shared_tensors_leave_no_named_file_in_dev_shm() -> None:
    """hivemind's default (file_system) named each shared tensor in /dev/shm, and a killed
    worker's process group left them there for good (no restart removed them)."""
    out = subprocess.run(
        [sys.executable, "-c", SHARED], capture_output=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert seen["strategy"] == "file_descriptor"
    assert seen["named"] == []
