"""The key file's temporary copy holds the private seed: a SIGKILL between writing it and
unlinking it left `.NAME.XXXX.tmp` beside the identity for good. It is named with its writer's
PID now, and load_or_create_identity removes those whose process is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain import key_file
from p2ptrain.key_file import PRIVATE_HEADER_32, load_or_create_identity


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_writer_s_temporary_key_is_swept(tmp_path: Path) -> None:
    dead = tmp_path / f".node.key.{_dead_pid()}.k3y_abc1.tmp"
    live = tmp_path / f".node.key.{os.getpid()}.k3y_abc2.tmp"  # being written right now
    others = tmp_path / f".node.key.5.{_dead_pid()}.k3y_abc3.tmp"  # key node.key.5's
    for path in (dead, live, others):
        path.write_bytes(PRIVATE_HEADER_32 + bytes(32))
    seed = load_or_create_identity(tmp_path / "node.key")
    assert (tmp_path / "node.key").read_bytes() == PRIVATE_HEADER_32 + seed
    assert not dead.exists()
    assert live.exists() and others.exists()
    load_or_create_identity(tmp_path / "node.key")  # an existing key's folder is swept too
    assert live.exists()


def test_the_temporary_key_is_named_with_its_writer_s_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names: list[str] = []
    link = os.link

    def watched(src: str, dst: str) -> None:
        names.append(Path(src).name)
        link(src, dst)

    monkeypatch.setattr(key_file.os, "link", watched)
    load_or_create_identity(tmp_path / "node.key")
    (name,) = names
    assert name.startswith(f".node.key.{os.getpid()}.") and name.endswith(".tmp")
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]
