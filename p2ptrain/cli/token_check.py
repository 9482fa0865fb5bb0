"""`join`'s token check, run in a short-lived child process.

Verifying a token loads the node's identity and cryptography's bindings (about 10 MiB resident);
`join`'s supervisor lives as long as the node and never needs them again, so it asks a child
(`python -m p2ptrain.cli.token_check`, the three inputs as JSON on stdin) and keeps its one-line
refusal: the child prints the problem on stdout and exits 2.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from p2ptrain.errors import UserError
from p2ptrain.flags import python_module
from p2ptrain.procs import parent_death

CHECK_TIMEOUT_S = 60.0  # a key file on a hung network mount must not hang `join` for good
REFUSED = 2


def check_token(token_arg: str, bootstrap: str, identity_path: str) -> None:
    """UserError if the token cannot admit this node to the bootstrap's run (see `problem_of`)."""
    request = json.dumps({"token": token_arg, "bootstrap": bootstrap, "identity": identity_path})
    try:
        done = subprocess.run(
            python_module("p2ptrain.cli.token_check"),
            input=request,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
            preexec_fn=parent_death(signal.SIGKILL),  # killed with us, even on a hung key file
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"--token: not checked in {CHECK_TIMEOUT_S:.0f} s") from None
    if done.returncode == 0:
        return
    if done.returncode == REFUSED and done.stdout.strip():
        raise UserError(done.stdout.strip().splitlines()[-1])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise UserError(f"--token: could not be checked (exit {done.returncode}: {tail})")


def problem_of(token_arg: str, bootstrap: str, identity_path: str) -> str | None:
    """Why the token cannot admit this node, or None: another node's (a wrong --identity: the
    default key file is per working directory), another organiser's, expired, or forged. Found
    out later, the node joined and waited for a planner for good."""
    from p2ptrain.errors import WireError
    from p2ptrain.identity import load_or_create_identity, peer_id_of
    from p2ptrain.records.token import read_token, token_problem

    try:
        token = read_token(token_arg)
    except WireError as exc:
        return f"--token: {exc}"
    organiser = bootstrap.rpartition("/p2p/")[2]
    if not organiser:
        return None  # the bootstrap address is refused on its own
    own = peer_id_of(load_or_create_identity(identity_path))
    problem = token_problem(token, organiser, own, now=time.time())
    if problem is None:
        return None
    if token.peer != own and token.issuer == organiser:
        problem += f" (this node's identity: {identity_path}; another node's token, or --identity?)"
    return f"--token: {problem}"


def _main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        problem = problem_of(request["token"], request["bootstrap"], request["identity"])
    except UserError as exc:
        problem = str(exc)
    if problem is None:
        return 0
    print(" ".join(problem.split()))  # one line, whatever the token's text held
    return REFUSED


if __name__ == "__main__":
    sys.exit(_main())
