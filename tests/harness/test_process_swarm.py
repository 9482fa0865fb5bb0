"""A harness swarm's children (harness/process_swarm.py): started all or none, each with its
log, waited for, and killed group by group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from p2ptrain.harness.process_swarm import ProcessSwarm


class _Swarm(ProcessSwarm):
    LOG = "kid-{index}.log"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_failed_start_kills_the_children_already_started(tmp_path: Path) -> None:
    swarm = _Swarm(tmp_path)

    def start(index: int) -> None:
        if index == 2:
            raise RuntimeError("the third child cannot start")
        swarm.spawn(index, _python("import time; time.sleep(60)"))

    with pytest.raises(RuntimeError, match="third child"):
        swarm.start_all(3, start)
    assert len(swarm.procs) == 2
    assert all(proc.wait(10) is not None for proc in swarm.procs)  # killed, not left running


def test_children_log_to_their_own_files_and_are_waited_for(tmp_path: Path) -> None:
    swarm = _Swarm(tmp_path)
    swarm.start_all(
        2,
        lambda index: swarm.spawn(
            index, _python(f"print('kid {index}'); raise SystemExit({index})")
        ),
    )
    assert swarm.wait_exit(10.0) == [0, 1]
    assert swarm.log_path(1) == tmp_path / "kid-1.log"
    assert swarm.log_tail(1) == "kid 1"
    assert swarm.log_tail(5) == ""  # never started: no log
    swarm.kill()  # nothing left to kill: harmless
