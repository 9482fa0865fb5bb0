"""The supervisor starts its control process with ControlSettings' command line."""

from __future__ import annotations

import io
import sys
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
    assert argv[:3] == [sys.executable, "-m", "p2ptrain.control"]
    assert ControlSettings.from_argv(argv[3:]) == ControlSettings(
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
