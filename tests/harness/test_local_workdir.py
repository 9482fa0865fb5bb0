"""`p2ptrain local`'s temp work directory is named with its PID, so that the next `local` removes
the one a killed run left (logs and checkpoints: its `finally` never ran)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from p2ptrain.harness.cli.local_cmd import TEMP_PREFIX, temp_workdir
from tests.test_ipc_dir import a_dead_pid


def test_the_next_local_removes_a_killed_runs_workdir() -> None:
    temp = Path(tempfile.gettempdir())
    prefix = f"{TEMP_PREFIX}{os.getuid()}-"
    killed = temp / f"{prefix}{a_dead_pid()}"
    (killed / "checkpoints").mkdir(parents=True)
    running = temp / f"{prefix}1"  # a live process's (pid 1): maybe a run going on
    running.mkdir(exist_ok=True)
    workdir = temp_workdir()
    try:
        assert workdir == temp / f"{prefix}{os.getpid()}"
        assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
        assert not killed.exists() and running.exists()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        running.rmdir()
