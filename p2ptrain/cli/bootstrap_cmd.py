"""`p2ptrain bootstrap`: a long-lived bootstrap node (control plane only).

Its first stdout line is its full multiaddr, the one others dial (never 0.0.0.0: the first
announced address, p2ptrain/addresses.py). It serves DHT discovery and publishes the run spec.
"""

from __future__ import annotations

import argparse

from p2ptrain.addresses import BOOTSTRAP_LISTEN
from p2ptrain.control.settings import ANNOUNCE, HTTP, IDENTITY, LISTEN


def add_arguments(parser: argparse.ArgumentParser) -> None:
    LISTEN.add(
        parser,
        default=BOOTSTRAP_LISTEN,
        help="multiaddr to listen on (default %(default)s: every interface; port 0: any)",
    )
    ANNOUNCE.add(
        parser,
        help="the addresses others should dial (e.g. a public IP in front of a NAT); default: "
        "this machine's interface addresses on the --listen port",
    )
    IDENTITY.add(parser, required=True, help="Ed25519 key file (created, mode 0600, if missing)")
    parser.add_argument("--run", default=None, help="run spec TOML (default: a built-in run)")
    HTTP.add(parser)
    parser.add_argument(
        "--revoked",
        default=None,
        metavar="FILE",
        help="`p2ptrain token revoke` lines, one a line; re-read every 10 s and published",
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.addresses import check_can_listen
    from p2ptrain.control.node import ControlNode, NodeConfig, configure_logging, run_node
    from p2ptrain.identity import load_or_create_identity
    from p2ptrain.node.identity_lock import IdentityLock
    from p2ptrain.records.run import load_run_spec

    spec = load_run_spec(args.run)
    check_can_listen(args.listen, "--listen")
    if args.revoked is not None:
        _check_revocations_file(args.revoked)
    configure_logging()
    seed = load_or_create_identity(args.identity)
    IdentityLock(args.identity)  # held for the process's life: one node per identity
    config = NodeConfig(
        seed=seed,
        role="bootstrap",
        listen_addr=args.listen,
        announce=tuple(args.announce),
        run=spec,
        revocations_path=args.revoked,
        http=args.http,
    )
    return run_node(ControlNode(config))


def _check_revocations_file(path: str) -> None:
    """UserError unless the --revoked file can be read now. A missing one only warned: a typo
    in its name left every revoked token admitted, the organiser told by one log line."""
    from p2ptrain.errors import UserError
    from p2ptrain.records.token import read_revocations

    try:
        read_revocations(path, [])
    except FileNotFoundError:
        raise UserError(
            f"--revoked {path}: no such file (to start with none revoked: touch {path})"
        ) from None
    except OSError as exc:
        raise UserError(f"--revoked {path}: cannot be read ({exc.strerror})") from None
