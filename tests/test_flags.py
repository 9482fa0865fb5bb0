"""Flags declared once (p2ptrain/flags.py): a record's fields give its parser, the record read
back from a command line, and the argv that gives a child the same record."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from p2ptrain.flags import Flag, FlagRecord, FlagSettings, flag_field, flag_metadata


@dataclass(frozen=True)
class _Child(FlagSettings):
    MODULE = "p2ptrain.child"
    DESCRIPTION = "a child for the tests"

    socket: str | None = flag_field(Flag("--socket", {}), one_of="source")
    plan: str | None = flag_field(Flag("--plan", {}), one_of="source")
    port: int = flag_field(Flag("--port", {"type": int}), 7)
    hosts: tuple[str, ...] = flag_field(Flag("--hosts", {"nargs": "+"}), ())
    loud: bool = flag_field(Flag("--loud", {"action": "store_true"}), False)
    tags: frozenset[str] = field(
        default=frozenset(),
        metadata=flag_metadata(
            Flag("--tag", {"action": "append", "default": []}),
            read=frozenset,
            write=lambda tags: [arg for tag in sorted(tags) for arg in ("--tag", tag)],
        ),
    )


@dataclass(frozen=True)
class _Parent(FlagRecord):
    name: str = flag_field(Flag("--name", {}), required=True)
    port: int = flag_field(Flag("--port", {"type": int}), 9)
    loud: bool = flag_field(Flag("--loud", {"action": "store_true"}), False)


def test_a_child_reads_back_the_argv_its_settings_write() -> None:
    child = _Child(socket="s", port=8, hosts=("a", "b"), loud=True, tags=frozenset({"x", "y"}))
    argv = child.to_argv()
    assert argv[:8] == ["--socket", "s", "--port", "8", "--hosts", "a", "b", "--loud"]
    assert argv[8:] == ["--tag", "x", "--tag", "y"]
    assert _Child.from_argv(argv) == child
    assert _Child(plan="p").to_argv() == ["--plan", "p"]  # defaults stay off the command line
    assert child.command()[1:4] == ["-P", "-m", "p2ptrain.child"]  # -P: test_module_path.py


@pytest.mark.parametrize("argv", [[], ["--socket", "s", "--plan", "p"], ["--plan"]])
def test_exactly_one_of_a_group_is_required(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _Child.from_argv(argv)
    assert exc.value.code == 2


def test_the_field_default_is_the_parsers() -> None:
    parser = argparse.ArgumentParser()
    _Parent.add_arguments(parser)
    assert _Parent.from_args(parser.parse_args(["--name", "n"])) == _Parent(name="n", port=9)
    with pytest.raises(SystemExit):
        parser.parse_args([])  # --name is required


def test_a_parent_hands_its_flags_on_by_name() -> None:
    parent = _Parent(name="n", port=5, loud=True)
    child = _Child.from_args(parent, socket="s", hosts=("h",))
    assert child == _Child(socket="s", port=5, hosts=("h",), loud=True)
    assert _Child.from_args(parent, socket="s", port=1).port == 1  # given wins
