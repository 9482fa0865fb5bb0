"""p2pd's routine errors (worker/daemon_env.py): its listener closing under a stopping worker is
not a failure to print on every Ctrl-C; its other errors still are."""

from __future__ import annotations

import logging

from p2ptrain.worker.daemon_env import RoutineDaemonErrors


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("hivemind.p2p.p2p_daemon", logging.ERROR, "x.go", 1, message, (), None)


def test_the_listener_closing_at_a_stop_is_dropped_and_other_errors_are_not() -> None:
    routine = RoutineDaemonErrors()
    closing = "accept failed: accept tcp 0.0.0.0:7402: use of closed network connection"
    assert not routine.filter(_record(closing))
    assert routine.filter(_record("failed to dial: connection refused"))
