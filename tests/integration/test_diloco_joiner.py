"""A peer that joins a diloco run mid-way (real `bootstrap` and `join` processes on 127.0.0.1)
takes its stage's outer state: the swarm re-plans it in, it fetches a member's state (its own
checkpoint folder is empty) with the anchor, the outer momentum and the count of outer steps,
and its outer rounds go on from that count with every replica in the group."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import ProcessReaper
from tests.integration.test_admission import start_bootstrap, start_trainer

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # about 1 min

# long enough that the run is still going when the joiner is planned in (its end is not awaited)
STEPS = 2000
JOIN_AFTER_STEP = 10
RUN = f"""
[run]
run_id = "diloco-joiner"
compute_aware = false
stages = 1
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
sync = "diloco"
inner_steps = 4
checkpoint_interval = 4
steps = {STEPS}
"""


def _steps(metrics: Path) -> set[int]:
    if not metrics.exists():
        return set()
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return {m["step"] for m in lines if m.get("type") == "metrics"}


def test_a_joiner_takes_the_stages_outer_state(reaper: ProcessReaper, tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    boot_addr = start_bootstrap(reaper, tmp_path, "--run", str(run))

    def join(name: str) -> None:
        start_trainer(reaper, tmp_path, boot_addr, tmp_path / name)

    join("a")
    join("b")
    deadline = time.monotonic() + 240
    while max(_steps(tmp_path / "a" / "metrics.jsonl"), default=-1) < JOIN_AFTER_STEP:
        assert time.monotonic() < deadline, "the first two peers did not train"
        time.sleep(0.5)
    join("late")
    late = tmp_path / "late"
    while len(_applied_after_fetch(late / "node.log")) < 2:  # two rounds with the joiner in
        assert time.monotonic() < deadline, (late / "node.log").read_text()[-3000:]
        time.sleep(0.5)
    log = (late / "node.log").read_text()
    after = _after_fetch(log.splitlines())
    [carried] = [
        int(line.split("outer state carried: ", 1)[1].split()[0])
        for line in after
        if "outer state carried: " in line
    ][:1]
    assert carried >= 1, log[-3000:]  # the members had made outer steps before it came
    applied = _applied_after_fetch(late / "node.log")
    assert f"outer step {carried + 1} applied" in applied[0], applied[:2]
    assert all("3 replicas)" in line for line in applied), applied
    assert "STAGE STATE LOST" not in log and "started fresh" not in log
    assert min(_steps(late / "metrics.jsonl")) > JOIN_AFTER_STEP  # it resumed, not restarted


def _after_fetch(lines: list[str]) -> list[str]:
    """The log from the fetch of a member's state on (nothing of its own: it came from them)."""
    fetched = [n for n, line in enumerate(lines) if "fetched stage-L0-2.step" in line]
    return lines[fetched[-1] :] if fetched else []


def _applied_after_fetch(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in _after_fetch(lines) if "outer step" in line and "applied" in line]
