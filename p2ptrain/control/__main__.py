"""Entry point of the control process that the node supervisor starts.

python -m p2ptrain.control --role control-only --identity FILE --bootstrap MADDR [--via MADDR...]
                           [--listen MADDR]
                           [--announce MADDR...] [--ipc SOCKET] [--token TOKEN] [--quiet]
                           [--http [HOST:]PORT]

The flags are ControlSettings' (control/settings.py), which the supervisor writes.
"""

from __future__ import annotations

import sys

from p2ptrain.control.settings import ControlSettings
from p2ptrain.errors import UserError


def main(argv: list[str] | None = None) -> int:
    settings = ControlSettings.from_argv(argv)
    from p2ptrain.control.node import ControlNode, NodeConfig, configure_logging, run_node
    from p2ptrain.identity import load_or_create_identity
    from p2ptrain.records.token import read_token

    configure_logging()
    try:
        config = NodeConfig(
            seed=load_or_create_identity(settings.identity),
            role=settings.role,
            listen_addr=settings.listen,
            announce=settings.announce,
            bootstrap_addr=settings.bootstrap,
            via=settings.via,
            ipc_path=settings.ipc,
            token=None if settings.token is None else read_token(settings.token),
            print_progress=not settings.quiet,
            http=settings.http,
        )
        node = ControlNode(config)
    except UserError as exc:
        print(f"p2ptrain control: error: {exc}", file=sys.stderr)
        return 2
    return run_node(node)


if __name__ == "__main__":
    sys.exit(main())
