"""The worker's command line: what the supervisor and the harnesses write is what it reads."""

from __future__ import annotations

import pytest

from p2ptrain.worker.faults import DIE_WHILE_AVERAGING, SKIP_AVERAGING, Fault, Faults
from p2ptrain.worker.settings import WorkerSettings


def test_settings_survive_their_command_line() -> None:
    settings = WorkerSettings(
        ipc="/tmp/c.sock",
        identity="peer.key",
        checkpoint_dir="ckpt",
        listen_host="0.0.0.0",
        listen_port=7402,
        announce=("/ip4/203.0.113.7/tcp/7402", "/dns4/node.example.org/tcp/7402"),
        metrics_log="m.jsonl",
        log_level="DEBUG",
        profile=True,
        faults=Faults((Fault(SKIP_AVERAGING, 2, 0, 1), Fault(DIE_WHILE_AVERAGING, 3, 1, 0))),
    )
    assert WorkerSettings.from_argv(settings.to_argv()) == settings
    assert settings.command()[1:4] == ["-P", "-m", "p2ptrain.worker"]
    assert settings.listen_maddr == "/ip4/0.0.0.0/tcp/7402"


def test_defaults_stay_off_the_command_line() -> None:
    assert WorkerSettings(ipc="s").to_argv() == ["--ipc", "s"]
    parsed = WorkerSettings.from_argv(["--plan", "p.json", "--name", "w0"])
    assert (parsed.listen_host, parsed.log_level, parsed.faults) == ("127.0.0.1", "INFO", Faults())
    assert (parsed.listen_maddr, parsed.announce) == ("/ip4/127.0.0.1/tcp/0", ())


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--ipc", "s", "--plan", "p.json"],
        ["--plan", "p.json"],
        ["--ipc", "s", "--fault", "explode@1:0:0"],
        ["--ipc", "s", "--fault", "skip-averaging@1:0"],
        ["--ipc", "s", "--fault", "skip-averaging@²:0:1"],  # "²".isdigit(); int("²") raises
        ["--ipc", "s", "--threads", "²"],
    ],
)
def test_bad_command_lines_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        WorkerSettings.from_argv(argv)
    assert exc.value.code == 2


def test_a_fault_with_non_ascii_digits_gets_the_usage_error() -> None:
    with pytest.raises(ValueError, match="a fault is KIND@STEP:STAGE:REPLICA"):
        Fault.parse("skip-averaging@²:0:1")


def test_a_fault_fires_only_at_its_step_and_role() -> None:
    faults = Faults((Fault.parse("skip-averaging@2:0:1"),))
    assert str(faults.items[0]) == "skip-averaging@2:0:1"
    assert faults.before_averaging(2, 0, 1)
    assert not faults.before_averaging(2, 0, 0)
    assert not faults.before_averaging(3, 0, 1)
