"""A child started as `python -m MODULE` (flags.python_module) imports nothing from the
working directory: a node started where a stray `attrs.py` lay crashed in every child at
import (trio needs attrs), and any such file's code ran as the node's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from p2ptrain.flags import python_module
from p2ptrain.worker.settings import WorkerSettings


def test_a_module_in_the_working_directory_shadows_no_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit(7)\n")  # what a stray file could do
    monkeypatch.chdir(tmp_path)
    shadowed = subprocess.run(
        [*python_module("json.tool")[:1], "-m", "json.tool"], input=b"{}", timeout=30
    )
    assert shadowed.returncode == 7  # plain -m: the working directory's json.py ran
    child = subprocess.run(python_module("json.tool"), input=b"{}", capture_output=True, timeout=30)
    assert child.returncode == 0
    assert child.stdout.strip() == b"{}"


def test_a_nodes_children_are_started_without_the_working_directory() -> None:
    """A node's control process and worker are started from their settings (flags.py)."""
    command = WorkerSettings().command()
    assert command[1:4] == ["-P", "-m", "p2ptrain.worker"]
