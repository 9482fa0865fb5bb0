"""Tokens and revocations share one line form and one signed-bytes rule (records/token.py):
the bytes an organiser signed before stay the bytes checked now, and one kind's line never
reads as the other."""

import pytest

from p2ptrain import identity
from p2ptrain.errors import WireError
from p2ptrain.records.token import (
    Revocation,
    Token,
    issue_revocation,
    issue_token,
    revocation_problem,
    token_problem,
)

ORGANISER_SEED = bytes(range(32))
ORGANISER = identity.peer_id_of(ORGANISER_SEED)
PEER = identity.peer_id_of(bytes(range(1, 33)))


def test_the_signed_bytes_are_the_ones_signed_before() -> None:
    token = issue_token(ORGANISER_SEED, PEER, True, 1.9e9, "run-a")
    assert (
        token.signed_bytes()
        == (
            f'{{"expires_at":1900000000.0,"issuer":"{ORGANISER}","peer":"{PEER}",'
            f'"planner":true,"run_id":"run-a"}}'
        ).encode()
    )
    runless = issue_token(ORGANISER_SEED, PEER, False, 1.9e9)
    assert b"run_id" not in runless.signed_bytes()
    revocation = issue_revocation(ORGANISER_SEED, PEER)
    assert revocation.signed_bytes() == f'{{"issuer":"{ORGANISER}","revoke":"{PEER}"}}'.encode()


def test_each_line_reads_back_as_its_own_kind_and_verifies() -> None:
    token = issue_token(ORGANISER_SEED, PEER, True, 1.9e9, "run-a")
    revocation = issue_revocation(ORGANISER_SEED, PEER)
    assert Token.decode(token.encode()) == token
    assert Revocation.decode(revocation.encode()) == revocation
    assert token_problem(Token.decode(token.encode()), ORGANISER, PEER, 0.0, "run-a") is None
    assert revocation_problem(Revocation.decode(revocation.encode()), ORGANISER) is None
    with pytest.raises(WireError, match="p2pt1"):
        Token.decode(revocation.encode())
    with pytest.raises(WireError, match="p2prv1"):
        Revocation.decode(token.encode())
