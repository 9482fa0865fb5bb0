"""`join` or `local` with worker faults injected: the tests' way in, kept out of the product's CLI.

    python -m p2ptrain.harness.with_faults join  [--fault KIND@STEP:STAGE:REPLICA]... JOIN_FLAGS
    python -m p2ptrain.harness.with_faults local [--fault KIND@STEP:STAGE:REPLICA]... LOCAL_FLAGS

Each command takes its own flags, plus repeatable `--fault` flags (worker/faults.py: the kinds,
and where each fires); `local` starts every node through this entry point with the same faults,
and each fires in whichever worker holds its role at its step.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from p2ptrain.cli import join_cmd
from p2ptrain.errors import UserError
from p2ptrain.harness.cli import local_cmd
from p2ptrain.harness.local_run import WITH_FAULTS as MODULE
from p2ptrain.worker.faults import KINDS, Faults
from p2ptrain.worker.settings import FAULT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in (("join", join_cmd), ("local", local_cmd)):
        sub_parser = sub.add_parser(name)
        module.add_arguments(sub_parser)
        FAULT.add(
            sub_parser,
            dest="faults",
            help=f"inject a fault into the worker(s) ({', '.join(KINDS)}); repeatable",
        )
        sub_parser.set_defaults(_run=module.run)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return int(args._run(args, Faults(tuple(args.faults))))
    except UserError as exc:
        print(f"p2ptrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
