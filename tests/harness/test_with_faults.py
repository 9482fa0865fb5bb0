"""Faults are the harness's: the product's `join` and `local` have no test-only flag, and the
harness's entry point (harness/with_faults.py) wraps them with `--fault` (issue 27)."""

from __future__ import annotations

import subprocess
import sys

from p2ptrain.app import SUBCOMMANDS
from p2ptrain.cli.main import build_parser
from p2ptrain.harness.local_run import command
from p2ptrain.worker.faults import SKIP_AVERAGING, Fault, Faults


def _help(name: str) -> str:
    parser = build_parser(SUBCOMMANDS, [name])
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name].format_help()  # type: ignore[index]


def test_the_products_help_shows_no_test_only_flag() -> None:
    for name in ("join", "local"):
        text = _help(name)
        assert "--fault" not in text and "for tests" not in text, name
    assert "--profile" in _help("join")  # an operator's feature: where each step's CPU went


def test_the_harness_wraps_join_with_faults() -> None:
    faults = Faults((Fault(SKIP_AVERAGING, 2, 0, 1),))
    wrapped = command("join", ["--bootstrap", "B"], faults)
    assert wrapped[1:5] == ["-P", "-m", "p2ptrain.harness.with_faults", "join"]
    assert wrapped[-2:] == ["--fault", "skip-averaging@2:0:1"]
    # no faults: the product's own command
    assert command("join", ["--bootstrap", "B"], Faults())[1:5] == ["-P", "-m", "p2ptrain", "join"]
    # a bad fault stops the wrapper with one line, before any node starts
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2ptrain.harness.with_faults",
            "join",
            "--bootstrap",
            "B",
            "--fault",
            "explode@1:0:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "a fault is KIND@STEP:STAGE:REPLICA" in done.stderr
    # and the product refuses the flag
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2ptrain",
            "join",
            "--bootstrap",
            "B",
            "--fault",
            "skip-averaging@2:0:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unrecognized arguments: --fault" in done.stderr


def test_join_profile_needs_a_metrics_log() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "p2ptrain", "join", "--bootstrap", "B", "--profile"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--metrics-log" in done.stderr
