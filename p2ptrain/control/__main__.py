"""Entry point of the control process that the node supervisor starts.

python -m p2ptrain.control --role control-only --identity FILE --bootstrap MADDR [--listen MADDR]
                           [--announce MADDR...] [--ipc SOCKET] [--token TOKEN] [--quiet]
                           [--http [HOST:]PORT]
"""

from __future__ import annotations

import argparse
import sys

from p2ptrain.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2ptrain.control")
    parser.add_argument("--role", choices=["control-only", "trainer"], required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    parser.add_argument("--announce", nargs="+", default=[], metavar="MADDR")
    parser.add_argument("--ipc", default=None)
    parser.add_argument("--token", default=None, help="the organiser's token, or a file holding it")
    parser.add_argument("--quiet", action="store_true", help="no progress line per worker step")
    parser.add_argument("--http", default=None, help="serve the dashboard on [HOST:]PORT")
    args = parser.parse_args(argv)
    from p2ptrain.control.node import ControlNode, NodeConfig, configure_logging, run_node
    from p2ptrain.identity import load_or_create_identity
    from p2ptrain.records.token import read_token

    configure_logging()
    try:
        config = NodeConfig(
            seed=load_or_create_identity(args.identity),
            role=args.role,
            listen_addr=args.listen,
            announce=tuple(args.announce),
            bootstrap_addr=args.bootstrap,
            ipc_path=args.ipc,
            token=None if args.token is None else read_token(args.token),
            print_progress=not args.quiet,
            http=args.http,
        )
        node = ControlNode(config)
    except UserError as exc:
        print(f"p2ptrain control: error: {exc}", file=sys.stderr)
        return 2
    return run_node(node)


if __name__ == "__main__":
    sys.exit(main())
