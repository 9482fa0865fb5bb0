"""No process outlives its node: SIGKILL, SIGTERM or Ctrl-C of `join`/`bootstrap` ends the tree."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ProcessReaper, descendants_of
from tests.control.swarm_helpers import peer_id, start_bootstrap, start_peer, wait_for_status

pytestmark = pytest.mark.integration


def is_running(pid: int) -> bool:
    """True unless pid is gone or a zombie."""
    with contextlib.suppress(OSError, IndexError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False


def wait_all_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if is_running(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return [p for p in pids if is_running(p)]


@pytest.mark.timeout(180)
def test_no_process_survives_its_node(tmp_path: Path, reaper: ProcessReaper) -> None:
    boot, boot_addr = start_bootstrap(reaper, tmp_path)
    nodes = {}
    for name in ("killed", "terminated", "interrupted"):
        # the killed one trains: its worker, hivemind's children and p2pd must go too
        proc, _ = start_peer(reaper, tmp_path, boot_addr, name, trainer=name == "killed")
        tree = descendants_of(proc.pid)
        assert tree, f"{name}: the supervisor has no control process"
        nodes[name] = (proc, tree)

    # SIGKILL of the supervisor alone: the kernel kills the control process (PR_SET_PDEATHSIG)
    # and stops the worker, which saves and exits (within 30 s: worker/watchdog.py), its
    # watchdog taking hivemind's children and p2pd with it
    proc, _ = nodes["killed"]
    deadline = time.monotonic() + 60
    while not any("p2pd" in _cmdline(p) for p in descendants_of(proc.pid)):
        assert time.monotonic() < deadline, "the trainer's worker never started p2pd"
        time.sleep(0.2)
    tree = descendants_of(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    left = wait_all_gone(tree, 40)
    assert left == [], f"outlived a SIGKILLed supervisor: {[_cmdline(p)[:100] for p in left]}"

    # SIGTERM and Ctrl-C (SIGINT): a clean stop of the whole tree, exit code 0
    for name, signum in (("terminated", signal.SIGTERM), ("interrupted", signal.SIGINT)):
        proc, tree = nodes[name]
        os.kill(proc.pid, signum)
        assert proc.wait(timeout=20) == 0, name
        assert wait_all_gone(tree, 5) == [], f"children outlived {name}"

    # the bootstrap is a single process: Ctrl-C stops it
    os.kill(boot.pid, signal.SIGINT)
    assert boot.wait(timeout=20) in (0, 130)


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    return ""


def _in_temp(*patterns: str) -> set[str]:
    temp = Path(tempfile.gettempdir())
    return {p.name for pattern in patterns for p in temp.glob(pattern)}


def _node_folders_in_temp() -> set[str]:
    """The nodes' IPC socket folders in the temp directory (of this and older versions), and the
    workers' temp folders (worker/private_tmp.py)."""
    return _in_temp("p2ptrain-node-*", "p2ptrain-ipc-*", "p2ptrain-worker-*")


def _loose_in_temp() -> set[str]:
    """What hivemind, multiprocessing and torch put in the temp directory itself: multiprocessing's
    listener folder, hivemind's Unix sockets, torch's shared-memory folder (a worker keeps them in
    its own folder; other runs on this machine may leave some: compare sets)."""
    return _in_temp("pymp-*", "hivemind-*", "torch-shm-dir-*")


def _p2pd_socket_folders(pids: list[int]) -> set[Path]:
    """Where the p2pd processes among `pids` have their control socket (`-listen=/unix/PATH`)."""
    folders = set()
    for args in (_cmdline(pid).split() for pid in pids):
        for arg in args[1:] if args and args[0].endswith("p2pd") else []:
            if arg.startswith("-listen=/unix/"):
                folders.add(Path(arg.removeprefix("-listen=/unix")).parent)
    return folders


@pytest.mark.timeout(240)
def test_a_crash_leaves_nothing_behind(tmp_path: Path, reaper: ProcessReaper) -> None:
    """Issue 26: SIGKILL of a node's process group (a crash, the OOM killer, `kill -9 -PGID`)
    while its planner runs searches. The search process, its helpers, the worker, hivemind's
    children and p2pd all die with it (the planner's multiprocessing worker and resource tracker
    used to survive, reparented to init), and no socket folder stays in the temp directory (the
    one beside the identity goes at the next start), nor any of hivemind's sockets or
    multiprocessing's folders: those were in the worker's own folder, beside the identity or
    (a path too long for a socket) in the temp directory until the next start."""
    temp_before, loose_before = _node_folders_in_temp(), _loose_in_temp()
    boot, boot_addr = start_bootstrap(reaper, tmp_path)
    trainer, trainer_addr = start_peer(reaper, tmp_path, boot_addr, "trainer", trainer=True)
    control, control_addr = start_peer(reaper, tmp_path, boot_addr, "control")
    nodes = {peer_id(trainer_addr): trainer, peer_id(control_addr): control}
    status, ok = wait_for_status(
        boot_addr, lambda s: s["plan"] is not None and s["planner"] in nodes, timeout_s=150
    )
    assert ok and status is not None, f"no plan: {status}"
    planner = nodes[status["planner"]]
    # the search process is kept for the node's lifetime: it is there from the first plan on
    deadline = time.monotonic() + 10
    while not any(
        "search_process" in _cmdline(p) or "multiprocessing" in _cmdline(p)
        for p in descendants_of(planner.pid)
    ):
        assert time.monotonic() < deadline, "the planner has no search process"
        time.sleep(0.2)
    trees = {proc.pid: descendants_of(proc.pid) for proc in nodes.values()}
    everything = [pid for tree in trees.values() for pid in tree]
    assert any("p2pd" in _cmdline(p) for p in trees[trainer.pid]), "the worker has no p2pd"
    sockets_in = _p2pd_socket_folders(trees[trainer.pid])
    assert sockets_in, "no p2pd socket found"
    assert Path(tempfile.gettempdir()) not in sockets_in, "hivemind's sockets in the temp dir"
    worker_folders = {p.name for p in sockets_in if p.name.startswith("p2ptrain-worker-")}
    for proc in nodes.values():
        os.killpg(proc.pid, signal.SIGKILL)  # the supervisor's process group
    left = wait_all_gone(everything, 10)
    assert left == [], f"outlived their node: {[_cmdline(p)[:120] for p in left]}"
    # the worker's own temp folder, if there, stays until the next start: nothing else does (of
    # these nodes' processes: a test beside this one has folders of its own live nodes there)
    ours = {str(pid) for pid in [*everything, *(proc.pid for proc in nodes.values())]}
    new_folders = _node_folders_in_temp() - temp_before
    left_folders = {name for name in new_folders if name.rsplit("-", 1)[-1] in ours}
    assert left_folders <= worker_folders, "a socket folder in temp"
    assert _loose_in_temp() - loose_before == set(), "hivemind's or multiprocessing's leftovers"
    stale = tmp_path / f".control.key.ipc-{control.pid}"
    assert stale.is_dir()  # beside the identity, until the next start with it sweeps it
    again, _ = start_peer(reaper, tmp_path, boot_addr, "control")
    assert not stale.exists(), "the next start left the crashed node's socket folder"
    assert _node_folders_in_temp() - temp_before == set(), "the next start left a worker's folder"
    assert (tmp_path / f".control.key.ipc-{again.pid}").is_dir()
    os.kill(again.pid, signal.SIGTERM)
    assert again.wait(timeout=20) == 0
    assert not (tmp_path / f".control.key.ipc-{again.pid}").exists()  # a clean stop: gone
    os.kill(boot.pid, signal.SIGINT)
    assert boot.wait(timeout=20) in (0, 130)
