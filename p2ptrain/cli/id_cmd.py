"""`p2ptrain id`: create this node's key if missing and print its peer id (what a volunteer
sends the organiser to get a token)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--identity", default="p2ptrain-identity.key", help="Ed25519 key file (created if missing)"
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.identity import load_or_create_identity, peer_id_of

    print(peer_id_of(load_or_create_identity(args.identity)))
    return 0
