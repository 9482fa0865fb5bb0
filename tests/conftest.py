"""Shared fixtures: a reaper that guarantees every process tree a test starts is killed."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from p2ptrain import procs

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts real processes (it asks for the `reaper`, or lives in integration/ or
    testbed/) is an integration test, marked or not: `./dev test` runs those one at a time, after
    the unit tests have run on two workers (two swarms at once on a 2-core box would starve each
    other's deadlines)."""
    for item in items:
        parts = item.path.parts
        if (
            "reaper" in getattr(item, "fixturenames", ())
            or "integration" in parts
            or "testbed" in parts
        ) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)


class ProcessReaper:
    """Starts commands in their own process groups and kills every group at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self._lines: dict[int, queue.Queue[str | None]] = {}

    def start(
        self, argv: Sequence[str], stderr_path: Path | None = None, cwd: Path = REPO_ROOT
    ) -> subprocess.Popen[bytes]:
        """Start argv (stdout piped and read line by line in the background) in a new session."""
        proc = procs.spawn(
            argv,
            log_path=stderr_path or os.devnull,
            stdout=subprocess.PIPE,
            die_with_parent=None,  # killed at teardown
            cwd=cwd,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        self._lines[proc.pid] = lines
        threading.Thread(target=self._pump, args=(proc, lines), daemon=True).start()
        self.procs.append(proc)
        return proc

    @staticmethod
    def _pump(proc: subprocess.Popen[bytes], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode(errors="replace").rstrip("\n"))
        lines.put(None)

    def read_line(self, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
        """The next stdout line of proc; fails the test on timeout or EOF."""
        try:
            line = self._lines[proc.pid].get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"no stdout line from {proc.args!r} within {timeout_s} s")
        if line is None:
            pytest.fail(f"{proc.args!r} exited ({proc.poll()}) before printing a line")
        return line

    def close(self) -> None:
        procs.stop_groups(self.procs, grace_s=5.0)


def processes_with(text: str) -> dict[int, str]:
    """pid -> state letter (R, S, T...) of every process whose command line contains `text`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            if text.encode() in (entry / "cmdline").read_bytes():
                found[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
    return found


def processes_in_session(session_id: int) -> list[int]:
    """PIDs whose session id is session_id (our children's descendants keep their session)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id:
                pids.append(int(entry.name))
    return pids


def live_group_members(pgid: int) -> list[int]:
    """PIDs of process group `pgid` that are not zombies."""
    members = []
    for entry in Path("/proc").iterdir():
        if not (entry.name.isascii() and entry.name.isdigit()):
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def descendants_of(pid: int) -> list[int]:
    """All live descendants of pid (from /proc parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@pytest.fixture
def reaper() -> Iterator[ProcessReaper]:
    """Start processes through this; all their process groups die when the test ends."""
    r = ProcessReaper()
    try:
        yield r
    finally:
        r.close()
