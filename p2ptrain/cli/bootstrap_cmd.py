"""`p2ptrain bootstrap`: a long-lived bootstrap node (control plane only).

Its first stdout line is its full multiaddr. It serves DHT discovery and publishes the run spec.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default="/ip4/127.0.0.1/tcp/0", help="multiaddr to listen on (port 0: any)"
    )
    parser.add_argument(
        "--identity", required=True, help="Ed25519 key file (created, mode 0600, if missing)"
    )
    parser.add_argument("--run", default=None, help="run spec TOML (default: a built-in run)")
    parser.add_argument(
        "--revoked",
        default=None,
        metavar="FILE",
        help="`p2ptrain token revoke` lines, one a line; re-read every 10 s and published",
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.control.node import ControlNode, NodeConfig, configure_logging, run_node
    from p2ptrain.identity import load_or_create_identity
    from p2ptrain.records.run import load_run_spec

    spec = load_run_spec(args.run)
    configure_logging()
    config = NodeConfig(
        seed=load_or_create_identity(args.identity),
        role="bootstrap",
        listen_addr=args.listen,
        run=spec,
        revocations_path=args.revoked,
    )
    return run_node(ControlNode(config))
