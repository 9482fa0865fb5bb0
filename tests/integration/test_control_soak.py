"""Issue 26's soak: 16 control-only peers on loopback beside a busy machine stay alive for 10
minutes, and not one control process exits (honest peers once lost control processes to a
corrupted GossipSub frame under load: docs/security.md, row 26.0).

Every node is started through the CLI with a soft open-file limit of 1024 (the usual default of a
service). Once the swarm has formed, CPU burners keep both cores busy for the 10 minutes (the
machine of a volunteer who also games, or a busy CI box); then they stop, and the bootstrap must
still see all 16 alive. The check is on process ids: the
control process each supervisor started first must be the one alive at the end (a supervisor
that restarted its control process would hide an exit from a liveness check)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ProcessReaper, descendants_of
from tests.control.swarm_helpers import (
    P2PTRAIN,
    SOFT_NOFILE,
    STARTUP_TIMEOUT_S,
    alive_ids,
    peer_id,
    start_bootstrap_with,
    start_peer,
    wait_for_status,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_PEERS = 16
SOAK_S = 600.0
BURNERS = 3  # more busy loops than cores: the control processes get what is left
CLI = (*SOFT_NOFILE, *P2PTRAIN)
STARTUP_S = STARTUP_TIMEOUT_S * 3
RUN = "[run]\nworker_stall_s = 0.0\n"


def _control_pid(supervisor_pid: int) -> int | None:
    """The supervisor's control process: its child running `-m p2ptrain.control` (the planner's
    search processes below it are not it)."""
    for pid in descendants_of(supervisor_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == supervisor_pid and b"-m\x00p2ptrain.control\x00" in cmdline:
            return pid
    return None


@pytest.mark.timeout(SOAK_S + 900)
def test_sixteen_control_peers_beside_a_busy_machine_stay_alive(
    reaper: ProcessReaper, tmp_path: Path
) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    boot, boot_addr = start_bootstrap_with(
        reaper, tmp_path, "--run", str(tmp_path / "run.toml"), cli=CLI, timeout_s=STARTUP_S
    )
    nodes = [
        start_peer(reaper, tmp_path, boot_addr, f"peer{i}", cli=CLI, timeout_s=STARTUP_S)
        for i in range(NUM_PEERS)
    ]
    everyone = {peer_id(addr) for _, addr in nodes}
    status, ok = wait_for_status(boot_addr, lambda s: alive_ids(s) >= everyone, 300)
    assert ok, status
    # the bootstrap is its own control process; a join node's is its supervisor's child
    controls = {proc.pid: _control_pid(proc.pid) for proc, _ in nodes}
    assert all(controls.values()), controls
    burners = [reaper.start([PYTHON, "-c", "while True: pass"]) for _ in range(BURNERS)]

    deadline = time.monotonic() + SOAK_S
    while time.monotonic() < deadline:
        assert boot.poll() is None, "the bootstrap exited during the soak"
        for proc, _ in nodes:
            assert proc.poll() is None, f"{proc.args!r} exited during the soak"
            assert _control_pid(proc.pid) == controls[proc.pid], (
                f"the control process of {proc.args!r} exited during the soak (see {tmp_path})"
            )
        time.sleep(5.0)
    assert all(b.poll() is None for b in burners)  # the machine was busy to the end
    for burner in burners:
        burner.kill()
    # and the swarm is whole: every peer still alive in the bootstrap's view (given the time a
    # machine that was overloaded for 10 minutes takes to drain its queues)
    status, ok = wait_for_status(boot_addr, lambda s: alive_ids(s) >= everyone, 300)
    assert ok, status
