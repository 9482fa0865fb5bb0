"""The key file is created whole or not at all (p2ptrain/key_file.py): written and synced under a
temporary name, then linked to its name, never clobbering a key another process made; a path it
cannot be created at is a one-line UserError, not an OSError's traceback."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from p2ptrain import key_file
from p2ptrain.errors import UserError
from p2ptrain.key_file import PRIVATE_HEADER_32, load_or_create_identity


def test_a_path_under_a_file_is_a_one_line_user_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UserError, match=r"^cannot create identity file .*node\.key: ") as error:
        load_or_create_identity(tmp_path / "a-file" / "node.key")
    assert "\n" not in str(error.value)


def test_a_read_only_directory_is_a_user_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(key_file.tempfile, "mkstemp", read_only)  # root ignores chmod
    with pytest.raises(UserError, match=r"node\.key: Permission denied$"):
        load_or_create_identity(tmp_path / "node.key")
    assert list(tmp_path.iterdir()) == []


def test_a_crash_before_the_key_is_synced_leaves_no_key_under_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """O_EXCL then write: a crash between them left an empty key, unreadable at every start."""

    def crash(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(key_file.os, "fsync", crash)
    path = tmp_path / "node.key"
    with pytest.raises(UserError, match="Input/output error"):
        load_or_create_identity(path)
    assert list(tmp_path.iterdir()) == []  # neither the key nor its temporary file
    monkeypatch.undo()
    seed = load_or_create_identity(path)
    assert path.read_bytes() == PRIVATE_HEADER_32 + seed
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]


def test_a_key_another_process_made_meanwhile_is_read_not_clobbered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "node.key"
    theirs = bytes(range(32))
    link = os.link

    def raced(src: str, dst: str) -> None:
        Path(dst).write_bytes(PRIVATE_HEADER_32 + theirs)  # the other process won
        link(src, dst)

    monkeypatch.setattr(key_file.os, "link", raced)
    assert load_or_create_identity(path) == theirs
    assert path.read_bytes() == PRIVATE_HEADER_32 + theirs
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]


def test_without_hard_links_the_key_is_still_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(key_file.os, "link", no_links)
    path = tmp_path / "keys" / "node.key"
    seed = load_or_create_identity(path)
    assert path.read_bytes() == PRIVATE_HEADER_32 + seed
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]
    assert load_or_create_identity(path) == seed
