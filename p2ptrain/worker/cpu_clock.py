"""CPU seconds spent by the worker's process tree: the worker, hivemind's DHT and averager
processes, and their p2pd daemon (Linux /proc; elsewhere it reads 0 and says so).

What a step's communication costs this machine locally (serialising, reducing, the daemon's
copies) is not in the stage's compute and not on the wire; the workers report it per averaging
round (`averaging_cpu_s`) so the bench's step simulation can add it, measured, not fitted
(docs/benchmarks.md). Reading a few /proc files takes well under a millisecond.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class TreeCpuClock:
    """User + system CPU seconds of a process and its descendants, the descendants found once
    (and again whenever one of them is gone): a session's processes live as long as it does."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self._pids: list[int] = []
        self.available = (PROC / str(self.root) / "stat").exists()

    def seconds(self) -> float:
        if not self.available:
            return 0.0
        if not self._pids:
            self._pids = _tree(self.root)
        total = 0.0
        for pid in self._pids:
            ticks = _cpu_ticks(pid)
            if ticks is None:  # gone (a daemon restarted): find the tree again next time
                self._pids = []
                continue
            total += ticks / TICKS_PER_S
        return total


def _tree(root: int) -> list[int]:
    """`root` and every descendant, from /proc/<pid>/task/<tid>/children."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = list((PROC / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return found


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of `pid` (fields 14 and 15 of /proc/<pid>/stat), or None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
    return int(fields[11]) + int(fields[12])
