"""Fuzzing the organiser's signed lines (records/token.py): a token or revocation in its text
form (`join --token`, a peer record's token, the bootstrap's --revoked file) decodes into a
record or raises the one wire error, never another exception, whatever the text or the file."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.errors import WireError
from p2ptrain.records import Revocation, Token, issue_revocation, issue_token
from p2ptrain.records.token import _to_line, read_revocations
from tests.records.samples import A, B
from tests.records.test_fuzz import _mutate, assert_no_slip

ORGANISER = bytes(range(32))
LINES: list[Any] = [
    (Token, issue_token(ORGANISER, A, True, 2e9, run_id="r")),
    (Revocation, issue_revocation(ORGANISER, B)),
]
SNIPPETS = ["", "=", "==", "\n", "\x00", "²", "٣", "é", "/", "+", "-", "_", "A" * 300, "e30"]


def _mutated_line(rng: random.Random, kind: Any, record: Any) -> str:
    """Half the time the JSON inside mutated and encoded again (it reaches the field readers),
    else the text itself cut, spliced or with a character changed."""
    if rng.random() < 0.5:
        return _to_line(kind.PREFIX, _mutate(rng, record.to_dict()))
    text = record.encode()
    at = rng.randint(0, len(text))
    roll = rng.random()
    if roll < 0.3:
        return text[:at] + rng.choice(SNIPPETS) + text[at:]
    if roll < 0.6:
        return text[:at] + text[at + rng.randint(1, 8) :]
    if roll < 0.9 and at < len(text):
        return text[:at] + chr(rng.randrange(0x20, 0x3000)) + text[at + 1 :]
    return text[:at]


@pytest.mark.parametrize(("kind", "record"), LINES, ids=["token", "revocation"])
def test_a_mutated_line_is_a_record_or_the_wire_error(kind: Any, record: Any) -> None:
    assert kind.decode(record.encode()) == record
    rng = random.Random(1)
    num_valid = 0
    for _ in range(1500):
        try:
            kind.decode(_mutated_line(rng, kind, record))
            num_valid += 1
        except WireError as exc:
            assert_no_slip(exc)
    assert num_valid < 1500  # the mutations do reach the checks


def test_any_revocations_file_is_read_or_the_wire_error(tmp_path: Path) -> None:
    """The bootstrap re-reads its --revoked file while it runs: a byte that is no UTF-8 (once a
    UnicodeDecodeError out of the reload), a bad or huge line, is a WireError."""
    rng = random.Random(1)
    kind, record = LINES[1]
    path = tmp_path / "revoked"
    for index in range(300):
        lines = [record.encode(), "# a comment", ""]
        lines += [_mutated_line(rng, kind, record) for _ in range(rng.randint(0, 2))]
        rng.shuffle(lines)
        data = "\n".join(lines).encode()
        if index % 3 == 0:
            at = rng.randint(0, len(data))
            data = data[:at] + rng.randbytes(rng.randint(1, 8)) + data[at:]
        path.write_bytes(data)
        try:
            assert all(isinstance(r, Revocation) for r in read_revocations(str(path)))
        except WireError as exc:
            assert_no_slip(exc)
