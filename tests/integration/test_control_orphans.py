"""No process outlives its node: SIGKILL, SIGTERM or Ctrl-C of `join`/`bootstrap` ends the tree."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import descendants_of
from tests.control.swarm_helpers import start_bootstrap, start_peer

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


@pytest.mark.timeout(120)
def test_no_process_survives_its_node(tmp_path, reaper):
    boot, boot_addr = start_bootstrap(reaper, tmp_path)
    nodes = {}
    for name in ("killed", "terminated", "interrupted"):
        proc, _ = start_peer(reaper, tmp_path, boot_addr, name)
        tree = descendants_of(proc.pid)
        assert tree, f"{name}: the supervisor has no control process"
        nodes[name] = (proc, tree)

    # SIGKILL of the supervisor alone: the kernel kills its children (PR_SET_PDEATHSIG)
    proc, tree = nodes["killed"]
    os.kill(proc.pid, signal.SIGKILL)
    assert wait_all_gone(tree, 10) == [], "children outlived a SIGKILLed supervisor"

    # SIGTERM and Ctrl-C (SIGINT): a clean stop of the whole tree, exit code 0
    for name, signum in (("terminated", signal.SIGTERM), ("interrupted", signal.SIGINT)):
        proc, tree = nodes[name]
        os.kill(proc.pid, signum)
        assert proc.wait(timeout=20) == 0, name
        assert wait_all_gone(tree, 5) == [], f"children outlived {name}"

    # the bootstrap is a single process: Ctrl-C stops it
    os.kill(boot.pid, signal.SIGINT)
    assert boot.wait(timeout=20) in (0, 130)
