"""A graceful stop of a stage's only holder hands the stage over (control/handover.py), as a
volunteer meets it: `p2ptrain local --peers 3` trains one pipeline of 2 stages and keeps one
spare; the holder of a stage (not the planner) gets SIGTERM mid-run. It stays until the next
plan's peer at its stage has fetched that stage's state from it, then stops; the run goes on
from where it was, where the stage used to start again from initial weights."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from p2ptrain.control.settings import HANDOVER_LIMIT_S
from tests.conftest import processes_with
from tests.integration.local_runs import finish_local, local_run, peer_logs, wait_for_steps

pytestmark = [pytest.mark.integration]

RUN = """
[run]
run_id = "handover-test"
# the plan's shape is what this test is about: 1 x 2 and a spare
compute_aware = false
stages = 2
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
"""
STEPS = 1500
STOP_AFTER_STEP = 60


def test_a_stopped_lone_holder_hands_its_stage_over(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    workdir = tmp_path / "swarm"
    with local_run(
        "--peers", "3", "--run", str(run), "--steps", str(STEPS), "--no-compression",
        "--workdir", str(workdir),
    ) as proc:  # fmt: skip
        wait_for_steps(proc, workdir, STOP_AFTER_STEP, timeout_s=150)
        holder = _placed_non_planner(workdir)
        key = str(workdir / f"peer-{holder}.key")
        supervisor = _supervisor(key)
        stopped_at = time.monotonic()
        os.kill(supervisor, signal.SIGTERM)
        while processes_with(key):
            assert time.monotonic() - stopped_at < HANDOVER_LIMIT_S, "the holder never left"
            time.sleep(0.2)
        left_after_s = time.monotonic() - stopped_at
        summary = finish_local(proc, timeout_s=300)
    assert summary["steps"] == STEPS
    own = (workdir / f"peer-{holder}.log").read_text()
    assert "handing the stage's state to the next plan first" in own
    assert "handed over: " in own and "the stage's state is handed over: stopping" in own
    assert left_after_s < 60, left_after_s  # a re-plan, an agreement and a fetch on loopback
    logs = peer_logs(workdir)
    assert "STAGE STATE LOST" not in logs
    assert not re.search(r"started from initial weights at step [1-9]", logs)  # only the start
    restarts = [int(s) for s in re.findall(r"agreed to start at step (\d+)", logs)]
    resumed = max(restarts)
    assert resumed >= STOP_AFTER_STEP - 1, restarts  # resumed where it was, not from 0
    # and its loss goes on from there: nearer the loss before the stop than the initial one
    loss = summary["loss"]
    before = sum(loss[resumed - 10 : resumed]) / 10
    after = sum(loss[resumed : resumed + 10]) / 10
    assert abs(after - before) < abs(after - loss[0]), (loss[0], before, after)
    assert not processes_with(str(workdir)), "a process of the run is left"


def _placed_non_planner(workdir: Path) -> int:
    """A peer that the first plan places and that did not make it (a stopping planner is
    replaced by an election first: a longer path, covered here only by its unit tests,
    tests/control/planning/test_handover_plans.py)."""
    for index in range(3):
        log = (workdir / f"peer-{index}.log").read_text()
        if "plan epoch 1: stage" in log and "published plan" not in log:
            return index
    raise AssertionError("no placed peer but the planner")


def _supervisor(key: str) -> int:
    """The pid of the `join` process of the node with this identity file."""
    for pid in processes_with(key):
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"\0join\0" in cmdline.read():
                return pid
    raise AssertionError(f"no join process for {key}")
