"""What a harness swarm of child process trees shares: each child's log file in the work
directory, starting them all or none, waiting for them to leave, and killing every group
(procs.py). The swarms add what their children are: bare workers (direct_swarm.py) or the
hivemind baseline's trainers (dp_swarm.py)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from p2ptrain import procs


class ProcessSwarm:
    """Children started in order, one process group and one log file (workdir/LOG) each."""

    LOG = "child-{index}.log"  # a subclass names its children's logs

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_all(self, count: int, start: Callable[[int], None]) -> None:
        """start(0) .. start(count - 1); if one fails (or we are interrupted) every child
        started so far is killed before the error goes on."""
        try:
            for index in range(count):
                start(index)
        except BaseException:
            self.kill()
            raise

    def spawn(self, index: int, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """Start child `index` (the next one) in its own process group, its output in its log."""
        self.procs.append(procs.spawn(list(argv), log_path=self.log_path(index), env=env))

    def log_path(self, index: int) -> Path:
        return self.workdir / self.LOG.format(index=index)

    def log_tail(self, index: int, num_lines: int = 30) -> str:
        path = self.log_path(index)
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-num_lines:])

    def wait_exit(self, timeout_s: float, only: Collection[int] | None = None) -> list[int | None]:
        """Wait for the children (those indexed `only`: the rest may stay, as a spare waiting
        for a plan) to leave on their own; every child's exit code (None: still running)."""
        deadline = time.monotonic() + timeout_s
        for index, proc in enumerate(self.procs):
            if only is not None and index not in only:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        return [proc.poll() for proc in self.procs]

    def kill(self) -> None:
        procs.kill_groups(self.procs)  # each child's whole tree: hivemind children, p2pd
