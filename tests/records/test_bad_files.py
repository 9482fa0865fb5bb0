"""A user's run spec or token file that is not text, or nests past Python's stack, is one error
line (UserError: exit 2), not a traceback (it was UnicodeDecodeError or RecursionError, exit 1,
from bootstrap, local, digest, export, token issue and join)."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.errors import UserError, WireError
from p2ptrain.records import load_run_spec
from p2ptrain.records.token import read_token


@pytest.mark.parametrize(
    "content",
    [
        b'[run]\nrun_id = "x\xff"\n',  # not UTF-8
        b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n",  # nested past the stack
        b"\x00\x01\x02",
    ],
)
def test_a_bad_run_spec_file_is_a_user_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    with pytest.raises(UserError, match="run spec"):
        load_run_spec(path)


def test_a_token_file_that_is_not_text_is_a_wire_error(tmp_path: Path) -> None:
    path = tmp_path / "token.txt"
    path.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(WireError, match="malformed token"):
        read_token(str(path))
    with pytest.raises(WireError, match="malformed token"):
        read_token("a\x00name")  # a NUL in a path: ValueError from open()
