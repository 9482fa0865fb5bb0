"""The supervisor starts its control process with ControlSettings' command line."""

from __future__ import annotations

import io
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.control.settings import ControlSettings
from p2ptrain.node import supervisor as supervisor_module
from p2ptrain.node.settings import NodeSettings
from p2ptrain.node.supervisor import Supervisor


class _Started:
    stdout = io.BytesIO(b"")


def test_the_control_command_line_parses_back_to_the_nodes_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[list[str]] = []

    def spawn(argv: list[str], **_: Any) -> _Started:
        started.append(argv)
        return _Started()

    monkeypatch.setattr(supervisor_module.procs, "spawn", spawn)
    # the node's ports as given, whatever on this machine holds them now
    monkeypatch.setattr(supervisor_module.addresses, "listen_problem", lambda host, port: None)
    node = Supervisor(
        NodeSettings(
            bootstrap="/ip4/127.0.0.1/tcp/7400/p2p/QmBoot",
            via=("/ip4/127.0.0.1/tcp/7500/p2p/QmMember",),
            identity="peer.key",
            listen="/ip4/127.0.0.1/tcp/7401",
            control_only=True,
            data_listen="/ip4/127.0.0.1/tcp/7402",
            announce=("/ip4/127.0.0.1/tcp/7401",),
            token="token.txt",
            quiet=True,
            http="127.0.0.1:8080",
        )
    )
    node._start_control("/tmp/c.sock", first=True)
    (argv,) = started
    assert argv[:4] == [sys.executable, "-P", "-m", "p2ptrain.control"]
    assert ControlSettings.from_argv(argv[4:]) == ControlSettings(
        role="control-only",
        identity="peer.key",
        bootstrap="/ip4/127.0.0.1/tcp/7400/p2p/QmBoot",
        via=("/ip4/127.0.0.1/tcp/7500/p2p/QmMember",),
        listen="/ip4/127.0.0.1/tcp/7401",
        announce=("/ip4/127.0.0.1/tcp/7401",),
        ipc="/tmp/c.sock",
        token="token.txt",
        quiet=True,
        http="127.0.0.1:8080",
    )


class _Control:
    """A control process that counts the SIGTERMs it is sent, and exits at the second."""

    def __init__(self) -> None:
        self.terms = 0

    def send_signal(self, signum: int) -> None:
        self.terms += signum == signal.SIGTERM

    def poll(self) -> int | None:
        return 0 if self.terms >= 2 else None


class _Worker:
    def poll(self) -> int | None:
        return None


@pytest.mark.timeout(10)  # it waited for a third signal: the hand-over's 150 s
def test_a_fast_double_ctrl_c_reaches_the_control_process_as_two_signals(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Both signals came before the supervisor passed the first on: the second still cuts
    the hand-over short (it used to count as one, and a third Ctrl-C was needed)."""
    monkeypatch.setattr(supervisor_module.addresses, "listen_problem", lambda host, port: None)
    node = Supervisor(
        NodeSettings(bootstrap="/ip4/127.0.0.1/tcp/7400/p2p/QmBoot", control_only=True)
    )
    node._on_signal(signal.SIGINT, None)
    node._on_signal(signal.SIGINT, None)
    control = _Control()
    node._let_control_leave([control, _Worker()], tmp_path / "handover-limit")  # type: ignore[list-item]
    assert control.terms == 2
