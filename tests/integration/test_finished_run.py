"""A finished run is finished for everyone (issue 27): a bootstrap and three `join` nodes with
workers train a 2-stage run of a few steps, so the plan places two and leaves one spare. Once
the last step is trained every node exits 0 within seconds of the others, the spare says why,
and nobody is planned again for the finished run (the bootstrap's status: finished, term 1)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from p2ptrain import identity
from p2ptrain.records import issue_token
from tests.conftest import PYTHON, ProcessReaper
from tests.control.swarm_helpers import (
    BOOTSTRAP_LOOPBACK,
    JOIN_LOOPBACK,
    STARTUP_TIMEOUT_S,
    get_status,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = """
[run]
run_id = "finished"
compute_aware = false
min_peers = 3
stages = 2  # three peers: one pipeline of two stages and a spare
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
steps = 8
checkpoint_interval = 0
"""
TRAIN_TIMEOUT_S = 300.0
ALL_LEAVE_S = 30.0  # from the first node's exit to the last one's


def _start_node(
    reaper: ProcessReaper, tmp: Path, boot_addr: str, name: str
) -> subprocess.Popen[bytes]:
    key = tmp / f"{name}.key"
    peer = identity.peer_id_of(identity.load_or_create_identity(key))
    token = issue_token(identity.load_identity(tmp / "boot.key"), peer, True, time.time() + 3600)
    proc = reaper.start(
        [
            PYTHON,
            "-m",
            "p2ptrain",
            "join",
            *JOIN_LOOPBACK,
            "--bootstrap",
            boot_addr,
            "--identity",
            str(key),
            "--token",
            token.encode(),
            "--checkpoint-dir",
            str(tmp / name),
        ],
        stderr_path=tmp / f"{name}.log",
    )
    reaper.read_line(proc, STARTUP_TIMEOUT_S)  # its multiaddr
    return proc


def _stdout(reaper: ProcessReaper, proc: subprocess.Popen[bytes]) -> list[str]:
    lines = []
    while not reaper._lines[proc.pid].empty():
        line = reaper._lines[proc.pid].get_nowait()
        if line is not None:
            lines.append(line)
    return lines


def test_every_node_leaves_a_finished_run(reaper: ProcessReaper, tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    boot = reaper.start(
        [
            PYTHON,
            "-m",
            "p2ptrain",
            "bootstrap",
            "--identity",
            str(tmp_path / "boot.key"),
            "--run",
            str(tmp_path / "run.toml"),
            *BOOTSTRAP_LOOPBACK,
        ],
        stderr_path=tmp_path / "boot.log",
    )
    boot_addr = reaper.read_line(boot, STARTUP_TIMEOUT_S)
    nodes = [_start_node(reaper, tmp_path, boot_addr, f"node{i}") for i in range(3)]
    exits: dict[int, float] = {}
    deadline = time.monotonic() + TRAIN_TIMEOUT_S
    while len(exits) < len(nodes) and time.monotonic() < deadline:
        for i, proc in enumerate(nodes):
            if i not in exits and proc.poll() is not None:
                exits[i] = time.monotonic()
        time.sleep(0.2)
    outputs = [_stdout(reaper, proc) for proc in nodes]
    assert len(exits) == len(nodes), (exits, outputs)
    assert [proc.returncode for proc in nodes] == [0, 0, 0], outputs
    assert max(exits.values()) - min(exits.values()) < ALL_LEAVE_S, (exits, outputs)
    trained = [out for out in outputs if any(line.startswith("step 7 ") for line in out)]
    spares = [out for out in outputs if out not in trained]
    assert len(trained) == 2 and len(spares) == 1, outputs
    [spare] = spares
    assert any(line.startswith("waiting for a place in the plan") for line in spare), spare
    assert any("run finished is finished" in line for line in spare), spare
    status = get_status(boot_addr)
    assert status is not None and status["finished"], status
    assert status["plan"]["term"] == 1, status["plan"]  # no one planned the finished run again
