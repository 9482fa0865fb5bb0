"""`p2ptrain bench`'s table of kinds (harness/cli/bench_cmd.py) and what the kinds share
(harness/cli/bench_kind.py): one table registers and dispatches every kind."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from p2ptrain.errors import UserError
from p2ptrain.harness.cli import bench_cmd
from p2ptrain.harness.cli.bench_kind import Kind, comma_integers, write_result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench")
    bench_cmd.add_arguments(parser)
    return parser


def test_every_kind_of_the_table_is_a_subcommand_with_its_output_flags() -> None:
    assert list(bench_cmd.KINDS) == [
        "scheduler",
        "netem",
        "e2e",
        "nat",
        "convergence",
        "control",
        "scaleout",
    ]
    args = _parser().parse_args(["control", "--json"])
    assert (args.kind, args.json, args.out) == ("control", True, "bench-results/control.json")
    assert _parser().parse_args(["scaleout"]).out == "bench-results"  # a folder: json and png
    assert _parser().parse_args(["e2e"]).steps == 10
    assert _parser().parse_args(["scaleout"]).steps == 80


def test_run_dispatches_through_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def run(args: argparse.Namespace) -> int:
        ran.append(args.kind)
        return 7

    kind = Kind("a test kind", lambda parser: None, run)
    monkeypatch.setitem(bench_cmd.KINDS, "control", kind)
    assert bench_cmd.run(argparse.Namespace(kind="control")) == 7
    assert ran == ["control"]


def test_comma_separated_integers_name_their_flag() -> None:
    assert comma_integers("64, 128,,256", "--scaling") == [64, 128, 256]
    assert comma_integers("", "--scaling") == []
    with pytest.raises(UserError, match="--peers must be comma-separated integers"):
        comma_integers("10,x", "--peers")


def test_a_result_is_written_with_its_folder(tmp_path: Path) -> None:
    out = write_result(tmp_path / "new" / "r.json", {"pass": True, "rows": [1, 2]})
    assert json.loads(out.read_text()) == {"pass": True, "rows": [1, 2]}
