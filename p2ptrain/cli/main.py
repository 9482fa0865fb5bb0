"""Entry point: parses the subcommand and hands over to its module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from p2ptrain import __version__
from p2ptrain.errors import UserError

# subcommand -> (module, one-line help). Each module exposes add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "schedule": (
        "p2ptrain.cli.schedule_cmd",
        "plan pipelines and data-parallel groups for a topology",
    ),
    "bench": ("p2ptrain.cli.bench_cmd", "run a benchmark and print a table (--json for machines)"),
    "bootstrap": ("p2ptrain.cli.bootstrap_cmd", "run a long-lived bootstrap node"),
    "join": ("p2ptrain.cli.join_cmd", "join a swarm as a peer"),
    "status": ("p2ptrain.cli.status_cmd", "show a swarm's peers, links, planner and plan"),
    "local": ("p2ptrain.cli.local_cmd", "start a bootstrap and N peers on this machine and train"),
    "testbed": (
        "p2ptrain.cli.testbed_cmd",
        "emulate a WAN in network namespaces; inject faults (root)",
    ),
}


def build_parser(available: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2ptrain",
        description="Peer-to-peer training of foundation models over slow, uneven links.",
    )
    parser.add_argument("--version", action="version", version=f"p2ptrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Import only the chosen subcommand's module (libp2p and hivemind must not meet in one process).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser([chosen] if chosen in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except UserError as exc:
        print(f"p2ptrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
