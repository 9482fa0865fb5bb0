"""Issue 26, low items: tokens sign the run they admit to; revocations are paged, not capped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from p2ptrain import identity
from p2ptrain.errors import WireError
from p2ptrain.records import Revocations, Token, issue_revocation, issue_token, token_problem
from p2ptrain.records.token import REVOCATIONS_PER_PAGE, read_revocations, revocation_pages

ORGANISER = bytes(range(32))
ISSUER = identity.peer_id_of(ORGANISER)
PEER = identity.peer_id_of(bytes(range(1, 33)))


def test_a_token_admits_only_to_the_run_it_names() -> None:
    token = Token.decode(issue_token(ORGANISER, PEER, True, 2e9, "run-a").encode())
    assert token.run_id == "run-a"
    assert token_problem(token, ISSUER, PEER, 0.0, "run-a") is None
    assert "run 'run-a', not for run 'run-b'" in (
        token_problem(token, ISSUER, PEER, 0.0, "run-b") or ""
    )
    assert token_problem(token, ISSUER, PEER, 0.0) is None  # the run not known yet: not checked
    # the run id is signed: changing it breaks the signature
    moved = Token.from_dict({**token.to_dict(), "run_id": "run-b"})
    assert "signature" in (token_problem(moved, ISSUER, PEER, 0.0, "run-b") or "")
    stripped = {k: v for k, v in token.to_dict().items() if k != "run_id"}
    assert "signature" in (token_problem(Token.from_dict(stripped), ISSUER, PEER, 0.0) or "")


def test_a_token_without_a_run_is_what_it_always_was() -> None:
    """Tokens issued before run ids were signed keep their JSON and their signature."""
    token = issue_token(ORGANISER, PEER, False, 2e9)
    assert set(token.to_dict()) == {"peer", "planner", "expires_at", "issuer", "sig"}
    old_bytes = json.dumps(
        {"peer": PEER, "planner": False, "expires_at": 2e9, "issuer": ISSUER},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    assert token.signed_bytes() == old_bytes
    assert token_problem(token, ISSUER, PEER, 0.0, "any-run") is None


@pytest.mark.parametrize("bad", [7, "x" * 65, "tab\there", None])
def test_a_token_with_a_bad_run_id_is_malformed(bad: object) -> None:
    data = {**issue_token(ORGANISER, PEER, False, 2e9).to_dict(), "run_id": bad}
    with pytest.raises(WireError):
        Token.from_dict(data)


def test_a_revocation_file_of_any_length_loads(tmp_path: Path) -> None:
    """Issue 26: the 201st revocation made the whole file unreadable."""
    peers = [identity.peer_id_of(os.urandom(32)) for _ in range(450)]
    lines = [issue_revocation(ORGANISER, peer).encode() for peer in peers]
    path = tmp_path / "revoked"
    path.write_text("# revoked\n\n" + "\n".join(lines) + "\n")
    entries = read_revocations(str(path))
    assert [r.peer for r in entries] == peers


def test_a_long_line_in_a_revocation_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("p2prv1." + "A" * 5000 + "\n")
    with pytest.raises(WireError):
        read_revocations(str(path))


def test_revocations_travel_in_bounded_pages() -> None:
    entries = tuple(
        issue_revocation(ORGANISER, identity.peer_id_of(os.urandom(32))) for _ in range(450)
    )
    pages = revocation_pages(entries)
    assert [len(p.entries) for p in pages] == [200, 200, 50]
    assert [(p.page, p.num_pages) for p in pages] == [(0, 3), (1, 3), (2, 3)]
    assert tuple(r for p in pages for r in p.entries) == entries
    for page in pages:
        assert Revocations.from_dict(page.to_dict()) == page
    assert revocation_pages(()) == [Revocations((), 0, 1)]
    # an older peer's list (no page fields) is one page of one
    assert Revocations.from_dict({"entries": []}) == Revocations((), 0, 1)
    with pytest.raises(WireError):
        Revocations.from_dict({"entries": [], "page": 3, "num_pages": 3})
    too_many = [entries[0].to_dict()] * (REVOCATIONS_PER_PAGE + 1)
    with pytest.raises(WireError):
        Revocations.from_dict({"entries": too_many})
