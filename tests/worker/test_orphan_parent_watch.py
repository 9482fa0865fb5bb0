"""An orphaned worker's stop bound is armed by a thread that watches for its parent's death, not
only by the SIGTERM handler: a main thread stuck in a C call never runs that handler."""

from __future__ import annotations

import os
import threading

import pytest

from p2ptrain.worker import watchdog


def test_the_bound_is_armed_without_the_handler_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "_parent", [os.getppid() + 1])  # the parent is gone
    monkeypatch.setattr(watchdog, "PARENT_POLL_S", 0.01)
    codes: list[int] = []
    left = threading.Event()

    def leave(code: int) -> None:
        codes.append(code)
        left.set()

    handler = watchdog.stop_handler(lambda: None, leave, bound_s=0.05)
    watchdog.stop_handler(lambda: None, leave, bound_s=0.05)  # SIGINT's: the same bound
    assert left.wait(30)  # hang guard: the handler never ran
    armed = watchdog._bounds[leave].timer
    handler()  # a signal after: no second exit armed
    assert watchdog._bounds[leave].timer is armed and codes == [1]
