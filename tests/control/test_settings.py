"""The control process's command line: what the supervisor writes is what the control process
reads, and the node commands add the same declared flags."""

from __future__ import annotations

import argparse

import pytest

from p2ptrain.control.settings import HTTP, ControlSettings


def test_settings_survive_their_command_line() -> None:
    settings = ControlSettings(
        role="trainer",
        identity="peer.key",
        bootstrap="/ip4/127.0.0.1/tcp/7400/p2p/QmBoot",
        listen="/ip4/0.0.0.0/tcp/7401",
        announce=("/ip4/203.0.113.7/tcp/7401", "/dns4/node.example.org/tcp/7401"),
        ipc="/tmp/c.sock",
        token="token.txt",
        quiet=True,
        http="127.0.0.1:8080,node.example.org",
    )
    assert ControlSettings.from_argv(settings.to_argv()) == settings
    assert settings.command()[1:4] == ["-P", "-m", "p2ptrain.control"]


def test_defaults_stay_off_the_command_line() -> None:
    settings = ControlSettings(role="control-only", identity="k", bootstrap="/ip4/127.0.0.1/tcp/1")
    assert settings.to_argv() == [
        "--role",
        "control-only",
        "--identity",
        "k",
        "--bootstrap",
        "/ip4/127.0.0.1/tcp/1",
    ]
    assert ControlSettings.from_argv(settings.to_argv()) == settings
    assert (settings.listen, settings.announce, settings.quiet) == (
        "/ip4/127.0.0.1/tcp/0",
        (),
        False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--role", "trainer", "--identity", "k"],  # no --bootstrap
        ["--role", "bootstrap", "--identity", "k", "--bootstrap", "b"],  # not a child's role
        ["--role", "trainer", "--identity", "k", "--bootstrap", "b", "--announce"],
    ],
)
def test_bad_command_lines_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ControlSettings.from_argv(argv)
    assert exc.value.code == 2


def test_a_command_adds_a_declared_flag_with_its_own_default() -> None:
    plain, own = argparse.ArgumentParser(), argparse.ArgumentParser()
    HTTP.add(plain)
    HTTP.but(help="other words").add(own, default="8080")
    assert plain.parse_args([]).http is None
    assert own.parse_args([]).http == "8080"
    assert own.parse_args(["--http", "9090"]).http == "9090"
