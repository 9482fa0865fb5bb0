"""A crash of a stage's only holder costs steps, not the stage (worker/resume/copies.py), as a
volunteer meets it: `p2ptrain local --peers 3` trains one pipeline of 2 stages and keeps one
spare, which copies a holder's newest saved state every second; that holder is SIGKILLed with
its whole tree (no hand-over), and the swarm resumes from the spare's copy, where the stage
used to restart from initial weights (STAGE STATE LOST)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import processes_with
from tests.control.swarm_helpers import StatusWatch
from tests.integration.local_runs import (
    finish_local,
    kill_peer,
    local_run,
    peer_logs,
    tiny_run_toml,
    tiny_swarm,
    wait_for_steps,
)

pytestmark = [pytest.mark.integration]

RUN = tiny_run_toml("copies-test", "spare_copy_interval_s = 1")  # 1 x 2 and a spare
STEPS = 500
KILL_AFTER_STEP = 100
COPIED = re.compile(r"copied layers L\d+-\d+ at step (\d+) from (\w+)")
BOOTSTRAP = re.compile(r"/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+")


def test_a_crashed_lone_holders_stage_resumes_from_the_spares_copy(tmp_path: Path) -> None:
    args, workdir = tiny_swarm(tmp_path, RUN, peers=3, steps=STEPS)
    with local_run(*args) as proc:
        wait_for_steps(proc, workdir, KILL_AFTER_STEP, timeout_s=150)
        copied_step, holder = _a_copy(workdir, timeout_s=60)
        # the organiser sees it: `status` names the spare's copy of that holder's stage
        assert _copy_in_status(workdir, holder, copied_step, timeout_s=30) >= copied_step
        kill_peer(workdir, _index_of(workdir, holder))
        summary = finish_local(proc, timeout_s=300)
    assert summary["steps"] == STEPS
    assert [len(p) for p in summary["plan"]["pipelines"]] == [2]  # the spare took the stage
    logs = peer_logs(workdir)
    assert "STAGE STATE LOST" not in logs
    assert not re.search(r"started from initial weights at step [1-9]", logs)  # only the start
    restarts = sorted({int(s) for s in re.findall(r"agreed to start at step (\d+)", logs)})
    assert len(restarts) >= 2 and restarts[-1] >= copied_step, (restarts, copied_step)
    # resumed where the copy was, not from 0: the loss goes on from there
    resumed, loss = restarts[-1], summary["loss"]
    before = sum(loss[resumed - 10 : resumed]) / 10
    after = sum(loss[resumed : resumed + 10]) / 10
    assert abs(after - before) < abs(after - loss[0]), (resumed, loss[0], before, after)
    assert not processes_with(str(workdir)), "a process of the run is left"


def _a_copy(workdir: Path, timeout_s: float) -> tuple[int, str]:
    """The step of the newest copy the spare kept by now (waiting for one), and its holder."""
    deadline = time.monotonic() + timeout_s
    while not (found := COPIED.findall(peer_logs(workdir))):
        assert time.monotonic() < deadline, "the spare kept no copy"
        time.sleep(0.2)
    step, holder = max((int(step), holder) for step, holder in found)
    return step, holder


def _copy_in_status(workdir: Path, holder: str, at_least: int, timeout_s: float) -> int:
    """The step of a spare's copy of `holder`'s stage in the bootstrap's `status --json`, once
    it is `at_least` (the copy the spare logged: gossip brings it a few seconds later; on a
    loaded box an earlier copy's step was read first), or the last one seen at `timeout_s`."""
    address = BOOTSTRAP.search((workdir / "bootstrap.log").read_text())
    assert address is not None
    deadline = time.monotonic() + timeout_s
    seen: list[int] = []
    with StatusWatch(address[0], 1.0) as watch:
        while (document := watch.next(deadline - time.monotonic())) is not None:
            plan = document["plan"] or {"spares": []}
            steps = [
                c["step"]
                for p in document["peers"]
                if p["id"] in plan["spares"]
                and (p["metrics"] or {}).get("copies_plan") == [plan.get("term"), plan.get("epoch")]
                for c in p["metrics"]["copies"]
                if c["holder"] == holder and c["step"] is not None
            ]
            seen = steps or seen
            if steps and max(steps) >= at_least:
                break
    assert seen, "status shows no copy"
    return int(max(seen))


def _index_of(workdir: Path, peer_id: str) -> int:
    """The index of the `local` node whose control process is `peer_id`."""
    for index in range(3):
        if f"control {peer_id} " in (workdir / f"peer-{index}.log").read_text():
            return index
    raise AssertionError(f"no node is {peer_id}")
