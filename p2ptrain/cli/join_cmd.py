"""`p2ptrain join`: join a swarm as a peer (supervisor + control process [+ worker process]).

Its first stdout line is the peer's full multiaddr (its first announced control-plane address);
a line per training step follows (--quiet: none). Test faults are injected through the harness's
own entry point (p2ptrain/harness/with_faults.py), never through this command's flags.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from p2ptrain.addresses import JOIN_DATA_LISTEN, JOIN_LISTEN
from p2ptrain.control.settings import (
    ANNOUNCE,
    BOOTSTRAP,
    HTTP,
    IDENTITY,
    LISTEN,
    QUIET,
    TOKEN,
    Flag,
)

if TYPE_CHECKING:
    from p2ptrain.worker.faults import Faults

# the node's own flags that `doctor` takes too (the control process's are control/settings.py's)
DATA_LISTEN = Flag("--data-listen", {"default": JOIN_DATA_LISTEN, "metavar": "MADDR"})
CONTROL_ONLY = Flag(
    "--control-only",
    {"action": "store_true", "help": "run the control plane alone (no worker)"},
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    BOOTSTRAP.add(parser)
    LISTEN.add(
        parser,
        default=JOIN_LISTEN,
        help="the control plane's listen multiaddr (default %(default)s: every interface)",
    )
    DATA_LISTEN.add(
        parser,
        help="the data plane's (the worker's p2pd) listen multiaddr, /ip4/HOST/tcp/PORT "
        "(default %(default)s)",
    )
    ANNOUNCE.add(
        parser,
        help="the control-plane addresses others should dial (e.g. a public IP); the data plane "
        "announces the same hosts on its own port. Default: this machine's interface addresses",
    )
    parser.add_argument(
        "--announce-data",
        nargs="+",
        default=[],
        metavar="MADDR",
        help="the data-plane addresses others should dial (default: from --announce)",
    )
    IDENTITY.add(parser, default="p2ptrain-identity.key")
    CONTROL_ONLY.add(parser)
    parser.add_argument(
        "--device",
        default="auto",
        help="where this node's stage trains: auto (the first CUDA GPU, else Apple's MPS, else "
        "the CPU), cpu, mps, cuda or cuda:I (default %(default)s)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="torch CPU threads of the worker (default 0: every core this process may use)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        help="where this node keeps its stage checkpoints (default: the run spec's checkpoint_dir)",
    )
    TOKEN.add(parser)
    parser.add_argument(
        "--metrics-log",
        metavar="FILE",
        help="append every report of this node's worker to FILE as a JSON line",
    )
    HTTP.add(parser)
    QUIET.add(parser)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --metrics-log: after each step's report, write where its CPU went (the "
        "worker's thread, its process tree, the averaging round; a `profile` line)",
    )


def run(args: argparse.Namespace, faults: Faults | None = None) -> int:
    """Run the node; `faults` are the harness's (harness/with_faults.py), for tests only."""
    from p2ptrain.errors import UserError
    from p2ptrain.node.supervisor import Supervisor
    from p2ptrain.worker.faults import NO_FAULTS
    from p2ptrain.worker.settings import DEVICE_PATTERN

    if args.profile and not args.metrics_log:
        raise UserError("--profile writes into the metrics log: give --metrics-log FILE")
    if not DEVICE_PATTERN.fullmatch(args.device):
        raise UserError(f"--device must be auto, cpu, mps, cuda or cuda:I, got {args.device!r}")
    if not 0 <= args.threads <= 4096:
        raise UserError(f"--threads must be between 0 and 4096, got {args.threads}")

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    supervisor = Supervisor(
        bootstrap=args.bootstrap,
        identity=args.identity,
        listen=args.listen,
        data_listen=args.data_listen,
        announce=tuple(args.announce),
        announce_data=tuple(args.announce_data),
        control_only=args.control_only,
        checkpoint_dir=args.checkpoint_dir,
        metrics_log=args.metrics_log,
        token=args.token,
        faults=faults or NO_FAULTS,
        profile=args.profile,
        device=args.device,
        threads=args.threads,
        quiet=args.quiet,
        http=args.http,
    )
    return supervisor.run()
