"""A finished run is finished for everyone (issue 27): a bootstrap and three `join` nodes with
workers train a 2-stage run of a few steps, so the plan places two and leaves one spare. Once
the last step is trained every node exits 0 within seconds of the others, the spare says why,
and nobody is planned again for the finished run (the bootstrap's status: finished, term 1)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ProcessReaper
from tests.control.swarm_helpers import (
    get_status,
    join_argv,
    planner_token,
    start_bootstrap_with,
    start_node,
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
    token = planner_token(tmp, name, valid_s=3600)
    argv = join_argv(
        boot_addr, tmp / f"{name}.key", "--checkpoint-dir", str(tmp / name), token=token
    )
    proc, _ = start_node(reaper, argv, tmp / f"{name}.log")  # and its multiaddr
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
    _, boot_addr = start_bootstrap_with(reaper, tmp_path, "--run", str(tmp_path / "run.toml"))
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
