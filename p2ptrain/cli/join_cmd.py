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

from p2ptrain.node.settings import NodeSettings

if TYPE_CHECKING:
    from p2ptrain.worker.faults import Faults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    NodeSettings.add_arguments(parser)


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
    supervisor = Supervisor(NodeSettings.from_args(args), faults or NO_FAULTS)
    return supervisor.run()
