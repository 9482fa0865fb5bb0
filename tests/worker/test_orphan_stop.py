"""A worker whose supervisor died (its parent-death signal is a SIGTERM: save, then exit) bounds
that stop itself: nobody else will SIGKILL it after the supervisor's grace (worker/watchdog.py)."""

from __future__ import annotations

import os
import threading

import pytest

from p2ptrain.worker import watchdog


class Leaves:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.left = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.left.set()


def test_an_orphaned_worker_leaves_after_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "_parent", [os.getppid() + 1])  # the parent is gone
    stops: list[bool] = []
    leave = Leaves()
    handler = watchdog.stop_handler(lambda: stops.append(True), leave, bound_s=0.1)
    handler()
    handler()  # a second signal arms no second exit
    assert stops == [True, True]
    assert leave.left.wait(5) and leave.codes == [1]


def test_a_worker_with_its_supervisor_stops_as_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "_parent", [os.getppid()])
    stops: list[bool] = []
    leave = Leaves()
    watchdog.stop_handler(lambda: stops.append(True), leave, bound_s=0.05)()
    assert stops == [True] and not leave.left.wait(0.3)  # the supervisor bounds the stop
