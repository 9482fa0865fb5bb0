"""A node outlives its control process: the supervisor of a real `p2ptrain join` restarts a
SIGKILLed control process after a back-off (one log line saying why), and the node serves and
rejoins the swarm under the same identity (issue 26: no per-connection failure ends a node)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest

from p2ptrain.node.supervisor import Backoff
from tests.conftest import descendants_of
from tests.control.swarm_helpers import (
    alive_ids,
    peer_id,
    start_bootstrap,
    start_peer,
    wait_for_status,
)

BACK_LINE = re.compile(r"the control process is back, listening on (\S+)")


def test_backoff_doubles_to_its_cap_and_resets_after_a_stable_run() -> None:
    backoff = Backoff(first_s=1.0, cap_s=30.0, stable_s=60.0)
    assert [backoff.after_exit(uptime_s=2.0) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.after_exit(uptime_s=61.0) == 1.0
    assert backoff.after_exit(uptime_s=1.0) == 2.0


def control_processes(supervisor: int) -> list[int]:
    """The supervisor's control processes (`-m p2ptrain.control`), not the helpers below them
    (the planner's search process, the compute measurement: `-m p2ptrain.control.<module>`)."""
    found = []
    for pid in descendants_of(supervisor):
        with contextlib.suppress(OSError):
            if b"p2ptrain.control" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


def wait_for_log(path: Path, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = pattern.search(path.read_text(errors="replace"))
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"no {pattern.pattern!r} in {path} within {timeout_s} s")


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_killed_control_process_is_restarted(tmp_path, reaper):
    _, boot_addr = start_bootstrap(reaper, tmp_path)
    node, node_addr = start_peer(reaper, tmp_path, boot_addr, "node")
    _, other_addr = start_peer(reaper, tmp_path, boot_addr, "other")
    (control,) = control_processes(node.pid)

    os.kill(control, signal.SIGKILL)
    log_path = tmp_path / "node.log"
    back = wait_for_log(log_path, BACK_LINE, 60)
    assert "the control process was killed by SIGKILL" in log_path.read_text()
    assert node.poll() is None, "the supervisor stopped the node"
    (restarted,) = control_processes(node.pid)
    assert restarted != control
    new_addr = back.group(1)
    assert peer_id(new_addr) == peer_id(node_addr)  # the same identity

    # it rejoined: through the bootstrap it found the other member again
    other_id = peer_id(other_addr)
    status, joined = wait_for_status(new_addr, lambda s: other_id in alive_ids(s), 60)
    assert joined, status
