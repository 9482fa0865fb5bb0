"""`p2ptrain join`: join a swarm as a peer (supervisor + control process [+ worker process]).

Its first stdout line is the peer's full multiaddr (its first announced control-plane address);
a line per training step follows (--quiet: none). Test faults are injected through the harness's
own entry point (p2ptrain/harness/with_faults.py), never through this command's flags.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.addresses import check_peer_address
from p2ptrain.cli.token_check import check_token
from p2ptrain.errors import UserError
from p2ptrain.node.settings import NodeSettings

if TYPE_CHECKING:
    from p2ptrain.worker.faults import Faults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    NodeSettings.add_arguments(parser)


def run(args: argparse.Namespace, faults: Faults | None = None) -> int:
    """Run the node; `faults` are the harness's (harness/with_faults.py), for tests only."""
    from p2ptrain.node.supervisor import Supervisor
    from p2ptrain.worker.faults import NO_FAULTS

    _check_flags(args)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    supervisor = Supervisor(NodeSettings.from_args(args), faults or NO_FAULTS)
    return supervisor.run()


def _check_flags(args: argparse.Namespace) -> None:
    """The flags judged before anything starts: a mistake is one line and exit code 2. Found
    out later it was two lines (the control process's and the supervisor's), a worker's crash
    after the first plan (the metrics log), a run that saved nothing (the checkpoint
    directory), or a node that waited for a planner for good (the token)."""
    from p2ptrain.worker.settings import DEVICE_PATTERN

    if args.profile and not args.metrics_log:
        raise UserError("--profile writes into the metrics log: give --metrics-log FILE")
    if not DEVICE_PATTERN.fullmatch(args.device):
        raise UserError(f"--device must be auto, cpu, mps, cuda or cuda:I, got {args.device!r}")
    if not 0 <= args.threads <= 4096:
        raise UserError(f"--threads must be between 0 and 4096, got {args.threads}")
    for flag, maddr in (("--bootstrap", args.bootstrap), *(("--via", m) for m in args.via)):
        check_peer_address(maddr, flag)
    if args.token:
        check_token(args.token, args.bootstrap, args.identity)  # in a child: see token_check
    if args.checkpoint_dir:
        _check_writable_dir(Path(args.checkpoint_dir), "--checkpoint-dir")
    if args.metrics_log:
        log_path = Path(args.metrics_log)
        if log_path.is_dir():
            raise UserError(f"--metrics-log {log_path}: a directory; give a file in one")
        _check_writable_dir(log_path.parent, "--metrics-log's folder")


def _check_writable_dir(path: Path, what: str) -> None:
    """UserError unless `path` is (or can be made) a directory this user may write in."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot be made ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: not writable by this user")
