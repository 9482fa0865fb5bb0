"""What every `p2ptrain bench` kind shares: its entry in bench's table of kinds, its `--json` and
`--out` flags, its progress lines on stderr, and the JSON file it writes. Stdlib only:
`p2ptrain --help` imports this."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Kind:
    """One kind of bench: its line in `bench --help`, its arguments, its runner."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def add_output_arguments(
    parser: argparse.ArgumentParser,
    out: str,
    json_help: str = "print one JSON object, no table",
    out_help: str = "where to write the JSON",
    **out_options: Any,
) -> None:
    """`--json` (the result on stdout as one JSON object) and `--out` (where it is written)."""
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("--out", default=out, help=out_help, **out_options)


def progress(message: str) -> None:
    """A bench's progress line (stderr: stdout is the table or the JSON)."""
    print(f"... {message}", file=sys.stderr, flush=True)


def write_result(path: Path | str, result: dict[str, Any]) -> Path:
    """Write a bench's result as JSON to `path` (its folder created); the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return out


def comma_integers(text: str, flag: str) -> list[int]:
    """A flag's comma-separated integers ('' gives none); UserError names the flag."""
    from p2ptrain.errors import UserError

    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated integers, got {text!r}") from None


def add_run_arguments(parser: argparse.ArgumentParser, steps: int) -> None:
    """The run the bench trains: a run spec, its steps and its pipeline stages."""
    parser.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")
    parser.add_argument("--steps", type=int, default=steps, help="training steps per run")
    parser.add_argument(
        "--stages", type=int, default=4, help="pipeline stages (default %(default)s)"
    )
