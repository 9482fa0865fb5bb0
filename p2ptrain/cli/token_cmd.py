"""`p2ptrain token issue`: the organiser signs a token that admits one peer to the run (and, with
--planner, lets it be elected planner and sign plans); `--run RUN.toml` or `--run-id ID` binds it
to that run (without either, it is valid in every run of the organiser's key, as tokens were
before run ids were signed). `p2ptrain token revoke` signs a revocation of every token of one
peer, for the bootstrap's `--revoked` file."""

from __future__ import annotations

import argparse

SECONDS_PER_DAY = 86_400.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    issue = actions.add_parser("issue", help="print a token for one peer")
    issue.add_argument(
        "--identity", required=True, help="the organiser's key: the bootstrap's identity file"
    )
    issue.add_argument("--peer", required=True, help="the peer id (`p2ptrain id` prints it)")
    issue.add_argument("--expires-days", type=float, default=30.0, help="default %(default)s")
    issue.add_argument("--planner", action="store_true", help="the peer may be elected planner")
    bound = issue.add_mutually_exclusive_group()
    bound.add_argument("--run", metavar="RUN.toml", help="bind the token to this run spec's run_id")
    bound.add_argument("--run-id", help="bind the token to the run of this run_id")
    revoke = actions.add_parser("revoke", help="print a revocation of one peer's tokens")
    revoke.add_argument(
        "--identity", required=True, help="the organiser's key: the bootstrap's identity file"
    )
    revoke.add_argument("--peer", required=True, help="the peer id whose tokens stop counting")


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from p2ptrain import identity
    from p2ptrain.errors import UserError
    from p2ptrain.identity import load_identity
    from p2ptrain.records import fields
    from p2ptrain.records.run import MAX_RUN_ID_CHARS, load_run_spec
    from p2ptrain.records.token import issue_revocation, issue_token

    if identity.public_key_of_peer_id(args.peer) is None:
        raise UserError(
            f"--peer {args.peer!r}: not a peer id (`p2ptrain id` prints one: 12D3KooW…)"
        )
    if args.action == "revoke":
        peer = fields.peer_id(args.peer, "revocation", "--peer")
        print(issue_revocation(load_identity(args.identity), peer).encode())
        return 0
    if not 0 < args.expires_days <= 3650:
        raise UserError("--expires-days must be in (0, 3650]")
    peer = fields.peer_id(args.peer, "token", "--peer")
    seed = load_identity(args.identity)
    expires_at = round(time.time() + args.expires_days * SECONDS_PER_DAY)
    run_id = load_run_spec(args.run).run_id if args.run else (args.run_id or "")
    if args.run_id is not None and not (
        0 < len(args.run_id) <= MAX_RUN_ID_CHARS and args.run_id.isprintable()
    ):
        raise UserError(f"--run-id must be 1..{MAX_RUN_ID_CHARS} printable characters")
    if not run_id:
        print(
            "p2ptrain: note: this token admits its peer to every run of this key; "
            "--run RUN.toml or --run-id binds it to one",
            file=sys.stderr,
        )
    print(issue_token(seed, peer, args.planner, expires_at, run_id).encode())
    return 0
