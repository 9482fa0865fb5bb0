"""A wait that lasts is said again (control/run_watch.py): a planner that never planned left one
"waiting for the first plan" line on the volunteer's terminal for good."""

from __future__ import annotations

import pytest

from p2ptrain.control import run_watch
from p2ptrain.control.run_watch import STILL_WAITING_S, RunWatch
from p2ptrain.control.waiting import Wait
from tests.control.test_gossip_screen import make_node


def test_an_unchanged_wait_is_said_again_with_how_long(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = make_node(joined=True)
    monkeypatch.setattr(run_watch, "waiting_for", lambda view, now: Wait("plan", "the first plan"))
    watch = RunWatch(state)
    for second in range(0, 3 * int(STILL_WAITING_S) + 1, 5):
        watch.tick(1000.0 + second)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "waiting for the first plan",
        "still waiting (1 min) for the first plan",
        "still waiting (2 min) for the first plan",
        "still waiting (3 min) for the first plan",
    ]
