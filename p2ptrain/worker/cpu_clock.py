"""CPU seconds spent by the worker's process tree: the worker, hivemind's DHT and averager
processes, and their p2pd daemon (psutil: user + system time of each process).

What a step's communication costs this machine locally (serialising, reducing, the daemon's
copies) is not in the stage's compute and not on the wire; a profiling worker (`join --profile`,
worker/profiler.py) measures it so the bench's step simulation can add it, measured, not fitted
(docs/benchmarks.md): per averaging round (split where its first part left and its last arrived
by `WireMarks`), and during the passes, split by process (`TreeCpu`: the worker's and the
daemon's, which move the frames, and the helper processes', which run beside them). A reading
takes well under a millisecond; the kernel's clock ticks in 10 ms, so what it reads is summed
over many steps.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import NamedTuple

import psutil

DAEMON_NAME = "p2pd"  # hivemind's libp2p daemon: its copies carry the frames


class TreeCpu(NamedTuple):
    """A reading of the tree's CPU clock, seconds: `own`, the worker's process and the p2pd
    daemon (the frames' work: serialising, the asyncio thread, the daemon's copies), and
    `helpers`, hivemind's DHT and averager processes (the rounds' work, and their own
    background between rounds)."""

    own: float
    helpers: float

    @property
    def total(self) -> float:
        return self.own + self.helpers


class TreeCpuClock:
    """User + system CPU seconds of a process and its descendants, the descendants found once
    (and again whenever one of them is gone): a session's processes live as long as it does."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self._procs: list[psutil.Process] = []
        self.available = _cpu_seconds(self.root) is not None
        # each process's last reading: a process that ends keeps what it spent (the clock
        # never runs back), in `_departed`
        self._last: dict[int, tuple[str, float]] = {}
        self._departed = TreeCpu(0.0, 0.0)

    def seconds(self) -> float:
        return self.split().total

    def split(self) -> TreeCpu:
        if not self.available:
            return TreeCpu(0.0, 0.0)
        if not self._procs:
            self._procs = _tree(self.root)
        readings = {}
        for proc in self._procs:
            read = _cpu_seconds(proc)
            if read is not None:
                readings[proc.pid] = read
        if len(readings) < len(self._procs):  # one ended (a daemon restarted): find the tree again
            self._procs = []
            for pid, (name, spent_s) in self._last.items():
                if pid not in readings:
                    self._departed = self._add(self._departed, pid, name, spent_s)
            self._last = {}
        self._last.update(readings)
        total = self._departed
        for pid, (name, spent_s) in readings.items():
            total = self._add(total, pid, name, spent_s)
        return total

    def _add(self, to: TreeCpu, pid: int, name: str, spent_s: float) -> TreeCpu:
        """`to` plus what `pid` spent, on its side of the split."""
        if pid == self.root or name == DAEMON_NAME:
            return TreeCpu(to.own + spent_s, to.helpers)
        return TreeCpu(to.own, to.helpers + spent_s)


def _tree(root: int) -> list[psutil.Process]:
    """`root` and every descendant (none if `root` is gone)."""
    try:
        proc = psutil.Process(root)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _cpu_seconds(proc: psutil.Process | int) -> tuple[str, float] | None:
    """The name and user + system CPU seconds of a process, or None if it is gone."""
    try:
        if isinstance(proc, int):
            proc = psutil.Process(proc)
        with proc.oneshot():
            times = proc.cpu_times()
            return proc.name(), times.user + times.system
    except psutil.Error:
        return None


class WireMarks:
    """The process tree's CPU clock when a round's first part left and when its last part
    arrived, read in the averager's process (worker/averaging/planned_group.py) and sent to the worker
    over a pipe: the round's CPU before the first and after the last cannot overlap the wire,
    the CPU between can (docs/benchmarks.md). Each mark reads the tree's clock; with no `root`
    (a worker that does not profile) nothing is read and no round reported."""

    def __init__(self, root: int | None) -> None:
        self.root = root  # the worker's pid: the tree the worker's own clock sums
        self._clock: TreeCpuClock | None = None  # made in the averager's process
        self._first_sent: float | None = None
        self._last_received: float | None = None
        # a SimpleQueue writes at once: a round's marks are there when its result is
        self._rounds: mp.SimpleQueue[tuple[float, float]] = mp.SimpleQueue()

    def start(self) -> None:
        """A round starts (averager's process)."""
        self._first_sent = self._last_received = None

    def mark(self, sent: int, received: int) -> None:
        """`sent` bytes left or `received` bytes arrived (averager's process)."""
        if self.root is None:
            return
        if self._clock is None:
            self._clock = TreeCpuClock(self.root)
        if sent and self._first_sent is None:
            self._first_sent = self._clock.seconds()
        if received:
            self._last_received = self._clock.seconds()

    def finish(self) -> None:
        """The round ended (averager's process): its marks go to the worker, if it moved bytes
        both ways."""
        if self._first_sent is not None and self._last_received is not None:
            self._rounds.put((self._first_sent, self._last_received))

    def last(self) -> tuple[float, float] | None:
        """(first sent, last received) of the latest round ended, or None (worker's process;
        read after every round, so the pipe never fills)."""
        marks = None
        while not self._rounds.empty():
            marks = self._rounds.get()
        return marks


def round_cpu_split(
    start_s: float, end_s: float, marks: tuple[float, float] | None
) -> tuple[float | None, float | None]:
    """A round's CPU (the tree's clock read at its start and end) before its first part left and
    after its last part arrived; (None, None) without marks."""
    if marks is None:
        return None, None
    spent = max(0.0, end_s - start_s)
    before = min(max(0.0, marks[0] - start_s), spent)
    return before, min(max(0.0, end_s - marks[1]), spent - before)
