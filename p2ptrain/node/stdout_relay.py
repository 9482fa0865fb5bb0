"""The node's stdout and stderr, relayed by the supervisor so that no reader can freeze the node.

stdout: the control process's lines (its address first, then progress), read from its pipe.
stderr: the log lines of the control process and the worker (read from their pipes) and the
supervisor's own (a log handler), where stderr can stall (a pipe, a terminal); a regular file
never does, and is left to them as before (`StderrRelay.needed`).

Whoever reads the node's stdout or stderr may stop (`join | head -1`) or stall (`join | less`,
`join 2>&1 | less` paused, Ctrl-S, a suspended job, a blocking log driver). A full pipe would
block a child's next print or log line, and with it its whole loop, while the supervisor saw it
alive: the node neither worked nor exited; a blocked log line of the supervisor's own stopped
its loop, which noted SIGTERM and never acted on it. So the pipes are always read: lines go
through a bounded backlog to a writer thread, and past it they are dropped (counted); once the
output is gone they are dropped for good.
One backlog and one writer serve the node's life, every restarted control process's lines
included: a writer each, each blocked on a stalled stdout, piled up one thread and 1,024 lines
per restart, and wrote over each other once the reader came back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import stat
import sys
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import IO, TextIO

log = logging.getLogger("p2ptrain.node.supervisor")

BACKLOG_LINES = 1024  # progress lines held for a slow reader of our stdout
LOG_BACKLOG_LINES = 8192  # log lines held for a slow reader of our stderr: a burst fits
MAX_LOG_LINE = 65536  # a child's stderr line longer than this is relayed in pieces
WRITER_DRAIN_S = 1.0  # at the end, how long the writer may take to write what is held


class LineRelay:
    """Lines from any number of sources to one output, written by one thread until `close`;
    what the backlog cannot hold is dropped, so that no source ever waits for the output."""

    def __init__(self, out: TextIO, backlog_lines: int = BACKLOG_LINES) -> None:
        self.out = out
        self.backlog: queue.Queue[str | None] = queue.Queue(backlog_lines)
        self.writer = threading.Thread(target=self._write_lines, daemon=True)
        self._starting = threading.Lock()
        self._relaying = threading.Condition()  # how many sources are still being read
        self._sources = 0
        self.dropped = 0

    def put(self, text: str) -> bool:
        """Hold `text` for the writer, never waiting: False when the backlog is full (dropped)."""
        try:
            self.backlog.put_nowait(text)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _count_source(self) -> None:
        self._start_writer()
        with self._relaying:
            self._sources += 1

    def _start_writer(self) -> None:
        with self._starting:  # by the first source
            if self.writer.ident is None:
                self.writer.start()

    def _run_counted(self, copy: Callable[[], None]) -> None:
        try:
            copy()
        finally:
            with self._relaying:
                self._sources -= 1
                self._relaying.notify_all()

    def _start_counted(self, copy: Callable[[], None]) -> threading.Thread:
        """`copy` on a thread of its own, counted before the thread runs: a `close` right after
        (a control process that died at once) waits for its lines. Counted in the thread, a
        close before it was scheduled returned at once and lost them."""
        self._count_source()
        thread = threading.Thread(target=self._run_counted, args=(copy,), daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Let the relays read their sources to the end, and the writer write what is held and
        end: WRITER_DRAIN_S at most for the relays, as long for room for the end mark, and as
        long again for the writer (a full backlog dropped the mark: its writer outlived the
        relay for good)."""
        if self.writer.ident is None:
            return
        # a child's last lines may still be in its pipe (it has exited): read first
        with self._relaying:
            self._relaying.wait_for(lambda: self._sources == 0, WRITER_DRAIN_S)
        with contextlib.suppress(queue.Full):
            self.backlog.put(None, timeout=WRITER_DRAIN_S)
        self.writer.join(WRITER_DRAIN_S)

    def _gap_note(self) -> str | None:
        """A line to write before the next one, after drops (none on stdout: it is data)."""
        return None

    def _on_gone(self, exc: Exception) -> None:
        """Say that the output is gone (its lines are dropped from now on)."""

    def _write_lines(self) -> None:
        write: Callable[[str], None] | None = partial(_write, self.out)
        while (text := self.backlog.get()) is not None:
            if write is None:
                continue
            try:
                if (note := self._gap_note()) is not None:
                    write(note)
                write(text)
            except (OSError, ValueError) as exc:  # ValueError: closed in this process
                self._on_gone(exc)
                _point_at_devnull(self.out)  # else the flush at exit fails again
                write = None
        with contextlib.suppress(OSError, ValueError):
            if write is not None and (note := self._gap_note()) is not None:
                write(note)


class StdoutRelay(LineRelay):
    """The node's stdout, fed by its control processes one after another (`relay`)."""

    def relay(self, source: Iterable[bytes], first: bool, on_line: Callable[[], None]) -> None:
        """Copy a control process's stdout lines (a restarted one's address line to the log)
        until it closes, calling `on_line` after each; never blocked by the node's stdout."""
        self._count_source()
        self._run_counted(partial(self._copy, source, first, on_line))

    def start(
        self, source: Iterable[bytes], first: bool, on_line: Callable[[], None]
    ) -> threading.Thread:
        """`relay` on a thread of its own (see _start_counted)."""
        return self._start_counted(partial(self._copy, source, first, on_line))

    def _copy(self, source: Iterable[bytes], first: bool, on_line: Callable[[], None]) -> None:
        for number, line in enumerate(source):
            text = line.decode(errors="replace")
            if number == 0 and not first:
                log.info("the control process is back, listening on %s", text.strip())
                continue
            if not self.put(text) and (self.dropped == 1 or self.dropped % 1000 == 0):
                log.warning("stdout is not being read: %d progress lines dropped", self.dropped)
            on_line()

    def _on_gone(self, exc: Exception) -> None:
        log.warning("stdout is gone (%s): dropping the progress lines", exc)


class StderrRelay(LineRelay):
    """The node's stderr: its children's log lines (`start`, a thread a child) and its own
    (`take_over_logging`), each line whole, none of them ever waiting for a stalled stderr.
    After drops, the next line written is preceded by a note saying how many."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(out, LOG_BACKLOG_LINES)
        self._noted = 0
        self._replaced: list[logging.Handler] = []

    @staticmethod
    def needed(out: TextIO) -> bool:
        """Can writing to `out` stall? Not a regular file (a log redirect): its children keep
        writing to it themselves, as before."""
        with contextlib.suppress(OSError, ValueError):
            return not stat.S_ISREG(os.fstat(out.fileno()).st_mode)
        return True  # no descriptor to judge: relay, never wait

    def start(self, source: IO[bytes]) -> threading.Thread:
        """Relay a child's stderr pipe until it closes (see _start_counted)."""
        return self._start_counted(partial(self._copy, source))

    def _copy(self, source: IO[bytes]) -> None:
        for line in iter(partial(source.readline, MAX_LOG_LINE), b""):
            text = line.decode(errors="replace")
            self.put(text if text.endswith("\n") else text + "\n")  # a killed child's last

    def take_over_logging(self) -> None:
        """Send the root logger's lines bound for our stderr through the relay (same level,
        format and filters) until `close`; other handlers (a file) are left as they are."""
        self._start_writer()
        root = logging.getLogger()
        for handler in list(root.handlers):
            if isinstance(handler, logging.StreamHandler) and _same_file(handler.stream, self.out):
                relayed = _RelayHandler(self, handler)
                root.removeHandler(handler)
                root.addHandler(relayed)
                self._replaced.append(handler)

    def close(self) -> None:
        """Write what is held (children's last lines and ours), then give stderr back to the
        handlers it was taken from."""
        super().close()
        root = logging.getLogger()
        for handler in list(root.handlers):
            if isinstance(handler, _RelayHandler) and handler.relay is self:
                root.removeHandler(handler)
        for handler in self._replaced:
            root.addHandler(handler)
        self._replaced.clear()

    def _gap_note(self) -> str | None:
        dropped = self.dropped
        if dropped == self._noted:
            return None
        self._noted = dropped
        return f"p2ptrain: stderr was not being read: {dropped} log lines dropped so far\n"

    def _on_gone(self, exc: Exception) -> None:
        """Nowhere to say it: the log goes to this very output."""


class _RelayHandler(logging.Handler):
    """The supervisor's log lines into the stderr relay: never blocks (drops when full)."""

    def __init__(self, relay: StderrRelay, like: logging.Handler) -> None:
        super().__init__(like.level)
        self.relay = relay
        self.setFormatter(like.formatter)
        for log_filter in like.filters:
            self.addFilter(log_filter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.relay.put(self.format(record) + "\n")
        except Exception:  # a record that cannot be formatted: logging's own report
            self.handleError(record)


def _same_file(stream: object, out: TextIO) -> bool:
    if stream is out:
        return True
    fileno = getattr(stream, "fileno", None)
    with contextlib.suppress(OSError, ValueError):
        return fileno is not None and bool(fileno() == out.fileno())
    return False


def relay_lines(
    source: Iterable[bytes], out: TextIO, first: bool, on_line: Callable[[], None]
) -> None:
    """One control process's lines relayed to `out` on a writer of their own (tests)."""
    relay = StdoutRelay(out)
    relay.relay(source, first, on_line)
    relay.close()


def _write(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()


def _point_at_devnull(out: TextIO) -> None:
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)


def stderr_relay() -> StderrRelay | None:
    """A relay for this process's stderr where it can stall, else None."""
    return StderrRelay(sys.stderr) if StderrRelay.needed(sys.stderr) else None
