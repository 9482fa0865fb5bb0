"""`p2ptrain doctor --bootstrap ADDR`: will joining that swarm work from this machine? One line
per check, each with a fix when it fails (node/doctor.py); exit 0 when joining will work, 1 when
not. Run it where `join` would run, with the flags `join` would get, while no node runs here.
"""

from __future__ import annotations

import argparse
import json

from p2ptrain.control.settings import BOOTSTRAP
from p2ptrain.node.settings import (
    CONTROL_ONLY,
    DATA_LISTEN,
    NODE_ANNOUNCE,
    NODE_DEVICE,
    NODE_LISTEN,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # join's own declarations, each said to be join's: the flags `join` would get
    BOOTSTRAP.add(parser)
    for flag in (NODE_LISTEN, DATA_LISTEN, NODE_ANNOUNCE, CONTROL_ONLY):
        flag.add(parser, help=f"as `join {flag.name}`: {flag.options['help']}")
    NODE_DEVICE.add(
        parser, default="auto", help=f"as `join --device`: {NODE_DEVICE.options['help']}"
    )
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
            device=args.device,
        )
    )
    for check in diagnosis.checks:
        print(check.line(), flush=True)
    failed = [check.name for check in diagnosis.checks if check.status == "FAIL"]
    print("joining will work" if diagnosis.ok else f"joining will not work: {', '.join(failed)}")
    if args.json:
        print(json.dumps(diagnosis.to_dict()))
    return 0 if diagnosis.ok else 1
