"""A graceful stop of a stage's only holder hands the stage over (control/handover.py), as a
volunteer meets it: `p2ptrain local --peers 3` trains one pipeline of 2 stages and keeps one
spare; a stage holder gets SIGTERM mid-run, then the planner. Each stays until the next plan's
peer at its stage has fetched that stage's state from it, then stops; the run goes on from where
it was, where the stage used to start again from initial weights."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from p2ptrain.control.settings import HANDOVER_LIMIT_S
from tests.conftest import processes_with
from tests.integration.local_runs import (
    finish_local,
    local_run,
    peer_logs,
    tiny_run_toml,
    tiny_swarm,
    wait_for_steps,
)

pytestmark = [pytest.mark.integration]

RUN = tiny_run_toml("handover-test")  # 1 x 2 and a spare
STEPS = 1200
STOP_AFTER_STEP = 60
THEN_AFTER_STEPS = 60  # trained under the plan after the first hand-over


def test_stopped_lone_holders_hand_their_stages_over(tmp_path: Path) -> None:
    """First a stage holder that is not the planner (its spare takes the stage), then the
    planner itself, now one of the two peers left (an election first; the last peer then
    trains the whole model, built from its own stage and the one fetched from the planner)."""
    args, workdir = tiny_swarm(tmp_path, RUN, peers=3, steps=STEPS)
    with local_run(*args) as proc:
        wait_for_steps(proc, workdir, STOP_AFTER_STEP, timeout_s=150)
        holder = _placed_non_planner(workdir)
        holder_left_s = _stop(workdir, holder)
        wait_for_steps(proc, workdir, _first_restart(workdir) + THEN_AFTER_STEPS, timeout_s=60)
        planner = _planner(workdir)
        planner_left_s = _stop(workdir, planner)
        summary = finish_local(proc, timeout_s=300)
    assert summary["steps"] == STEPS
    assert [len(p) for p in summary["plan"]["pipelines"]] == [1]  # the last peer, every layer
    for index in (holder, planner):
        own = (workdir / f"peer-{index}.log").read_text()
        assert "handing the stage's state to the next plan first" in own
        assert "handed over: " in own and "the stage's state is handed over: stopping" in own
    # a re-plan (an election first for the planner), an agreement and a fetch on loopback
    assert holder_left_s < 60 and planner_left_s < 60, (holder_left_s, planner_left_s)
    logs = peer_logs(workdir)
    assert "STAGE STATE LOST" not in logs
    assert not re.search(r"started from initial weights at step [1-9]", logs)  # only the start
    restarts = sorted({int(s) for s in re.findall(r"agreed to start at step (\d+)", logs)})
    assert len(restarts) >= 3 and restarts[1] >= STOP_AFTER_STEP - 1, restarts
    # resumed where it was, not from 0, each time: the loss goes on from there
    loss = summary["loss"]
    for resumed in restarts[1:]:
        before = sum(loss[resumed - 10 : resumed]) / 10
        after = sum(loss[resumed : resumed + 10]) / 10
        assert abs(after - before) < abs(after - loss[0]), (resumed, loss[0], before, after)
    assert not processes_with(str(workdir)), "a process of the run is left"


def _stop(workdir: Path, index: int) -> float:
    """SIGTERM node `index`'s `join` and wait until its every process is gone: the seconds."""
    key = str(workdir / f"peer-{index}.key")
    stopped_at = time.monotonic()
    os.kill(_supervisor(key), signal.SIGTERM)
    while processes_with(key):
        assert time.monotonic() - stopped_at < HANDOVER_LIMIT_S, f"peer {index} never left"
        time.sleep(0.2)
    return time.monotonic() - stopped_at


def _first_restart(workdir: Path) -> int:
    """The step the plan after the first hand-over started at."""
    return max(int(s) for s in re.findall(r"agreed to start at step (\d+)", peer_logs(workdir)))


def _planner(workdir: Path) -> int:
    """The peer whose control process published the plans."""
    for index in range(3):
        if "published plan" in (workdir / f"peer-{index}.log").read_text():
            return index
    raise AssertionError("no planner")


def _placed_non_planner(workdir: Path) -> int:
    """A peer that the first plan places and that did not make it."""
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
