"""The node's stdout: the control process's lines (its address first, then progress), relayed
by the supervisor, which reads them from the control's pipe.

Whoever reads the node's stdout may stop (`join | head -1`) or stall (`join | less`, a
suspended job, a blocking log driver). A full pipe would block the control process's next
print, and with it its whole loop, while the supervisor saw it alive: the node neither worked
nor exited. So the pipe is always read: lines go through a bounded backlog to a writer thread,
and past it they are dropped (counted, warned); once stdout is gone they are dropped for good.
One backlog and one writer serve the node's life, every restarted control process's lines
included: a writer each, each blocked on a stalled stdout, piled up one thread and 1,024 lines
per restart, and wrote over each other once the reader came back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable
from typing import TextIO

log = logging.getLogger("p2ptrain.node.supervisor")

BACKLOG_LINES = 1024  # progress lines held for a slow reader of our stdout
WRITER_DRAIN_S = 1.0  # at the end, how long the writer may take to write what is held


class StdoutRelay:
    """The node's stdout, fed by its control processes one after another (`relay`), written by
    one thread until `close`."""

    def __init__(self, out: TextIO) -> None:
        self.backlog: queue.Queue[str | None] = queue.Queue(BACKLOG_LINES)
        self.writer = threading.Thread(target=_write_lines, args=(self.backlog, out), daemon=True)
        self._starting = threading.Lock()
        self._relaying = threading.Condition()  # how many sources are still being read
        self._sources = 0
        self.dropped = 0

    def relay(self, source: Iterable[bytes], first: bool, on_line: Callable[[], None]) -> None:
        """Copy a control process's stdout lines (a restarted one's address line to the log)
        until it closes, calling `on_line` after each; never blocked by the node's stdout."""
        self._count_source()
        self._relay_counted(source, first, on_line)

    def start(
        self, source: Iterable[bytes], first: bool, on_line: Callable[[], None]
    ) -> threading.Thread:
        """`relay` on a thread of its own, counted before the thread runs: a `close` right
        after (a control process that died at once) waits for its lines. Counted in the
        thread, a close before it was scheduled returned at once and lost them."""
        self._count_source()
        thread = threading.Thread(
            target=self._relay_counted, args=(source, first, on_line), daemon=True
        )
        thread.start()
        return thread

    def _count_source(self) -> None:
        with self._starting:  # by the first control process's relay
            if self.writer.ident is None:
                self.writer.start()
        with self._relaying:
            self._sources += 1

    def _relay_counted(
        self, source: Iterable[bytes], first: bool, on_line: Callable[[], None]
    ) -> None:
        try:
            self._copy(source, first, on_line)
        finally:
            with self._relaying:
                self._sources -= 1
                self._relaying.notify_all()

    def _copy(self, source: Iterable[bytes], first: bool, on_line: Callable[[], None]) -> None:
        for number, line in enumerate(source):
            text = line.decode(errors="replace")
            if number == 0 and not first:
                log.info("the control process is back, listening on %s", text.strip())
                continue
            try:
                self.backlog.put_nowait(text)
            except queue.Full:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("stdout is not being read: %d progress lines dropped", self.dropped)
            on_line()

    def close(self) -> None:
        """Let the relays read their sources to the end, and the writer write what is held and
        end: WRITER_DRAIN_S at most for the relays, as long for room for the end mark, and as
        long again for the writer (a full backlog dropped the mark: its writer outlived the
        relay for good)."""
        if self.writer.ident is None:
            return
        # a control process's last lines may still be in its pipe (it has exited): read first
        with self._relaying:
            self._relaying.wait_for(lambda: self._sources == 0, WRITER_DRAIN_S)
        with contextlib.suppress(queue.Full):
            self.backlog.put(None, timeout=WRITER_DRAIN_S)
        self.writer.join(WRITER_DRAIN_S)


def relay_lines(
    source: Iterable[bytes], out: TextIO, first: bool, on_line: Callable[[], None]
) -> None:
    """One control process's lines relayed to `out` on a writer of their own (tests)."""
    relay = StdoutRelay(out)
    relay.relay(source, first, on_line)
    relay.close()


def _write_lines(backlog: queue.Queue[str | None], out: TextIO) -> None:
    target: TextIO | None = out
    while (text := backlog.get()) is not None:
        if target is None:
            continue
        try:
            target.write(text)
            target.flush()
        except (OSError, ValueError) as exc:  # ValueError: closed in this process
            log.warning("stdout is gone (%s): dropping the progress lines", exc)
            _point_at_devnull(target)  # else the flush at exit fails again
            target = None


def _point_at_devnull(out: TextIO) -> None:
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
