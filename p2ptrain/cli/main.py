"""The machinery of the `p2ptrain` command: a parser with one subcommand per module, and the
dispatch to the chosen one. Which modules those are is the table in p2ptrain/app.py.

Each subcommand module exposes add_arguments(parser) and run(args) -> int. Only the chosen one is
imported (py-libp2p and hivemind cannot be imported into one process); --help imports them all,
so none may import a heavy library at module level.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

from p2ptrain import __version__
from p2ptrain.errors import UserError

# subcommand -> (module, one-line help)
Subcommands = Mapping[str, tuple[str, str]]


def build_parser(
    subcommands: Subcommands, available: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2ptrain",
        description="Peer-to-peer training of foundation models over slow, uneven links.",
    )
    parser.add_argument("--version", action="version", version=f"p2ptrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in subcommands.items():
        if available is not None and name not in available:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # subcommand not built yet
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(_run=module.run)
    return parser


def dispatch(subcommands: Subcommands, argv: Sequence[str] | None = None) -> int:
    """Parse argv (default: this process's) and run the chosen subcommand; its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Import only the chosen subcommand's module (libp2p and hivemind must not meet in one process).
    chosen = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(subcommands, [chosen] if chosen in subcommands else None)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except UserError as exc:
        print(f"p2ptrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
