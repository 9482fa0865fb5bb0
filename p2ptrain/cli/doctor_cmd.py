"""`p2ptrain doctor --bootstrap ADDR`: will joining that swarm work from this machine? One line
per check, each with a fix when it fails (node/doctor.py); exit 0 when joining will work, 1 when
not. Run it where `join` would run, with the flags `join` would get, while no node runs here.
"""

from __future__ import annotations

import argparse
import json

from p2ptrain.addresses import JOIN_LISTEN
from p2ptrain.cli.join_cmd import CONTROL_ONLY, DATA_LISTEN
from p2ptrain.control.settings import ANNOUNCE, BOOTSTRAP, LISTEN


def add_arguments(parser: argparse.ArgumentParser) -> None:
    BOOTSTRAP.add(parser)
    LISTEN.add(
        parser,
        default=JOIN_LISTEN,
        help="the control plane's listen multiaddr, as `join --listen` (default %(default)s)",
    )
    DATA_LISTEN.add(
        parser,
        help="the data plane's listen multiaddr, as `join --data-listen` (default %(default)s)",
    )
    ANNOUNCE.add(
        parser,
        help="the control-plane addresses to be dialled back at, as `join --announce` (default: "
        "this machine's interface addresses)",
    )
    CONTROL_ONLY.add(parser, help="as `join --control-only`: no data plane to check")
    parser.add_argument(
        "--json", action="store_true", help="also print one JSON object as the last line"
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.node.doctor import DoctorSettings, diagnose

    diagnosis = diagnose(
        DoctorSettings(
            bootstrap=args.bootstrap,
            listen=args.listen,
            data_listen=args.data_listen,
            announce=tuple(args.announce),
            control_only=args.control_only,
        )
    )
    for check in diagnosis.checks:
        print(check.line(), flush=True)
    failed = [check.name for check in diagnosis.checks if check.status == "FAIL"]
    print("joining will work" if diagnosis.ok else f"joining will not work: {', '.join(failed)}")
    if args.json:
        print(json.dumps(diagnosis.to_dict()))
    return 0 if diagnosis.ok else 1
