"""The worker side of the control <-> worker IPC (records/messages.py): newline-delimited JSON over a
Unix socket. The worker connects, says hello, then receives plans and a stop; it sends metrics.
When the control process goes away (the supervisor restarts one that died), the worker keeps its
state and training, connects again when the socket is back, and repeats who it is (its hello, compute
and saved reports) to the new control process.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable

from p2ptrain.errors import UserError
from p2ptrain.ipc_lines import LineBuffer, decode, encode
from p2ptrain.records import (
    ComputeReport,
    CopyReport,
    Hello,
    Message,
    PlanMessage,
    RunMessage,
    RunSpec,
    SavedReport,
    Stop,
)

log = logging.getLogger(__name__)

# longer than the supervisor's longest back-off (node/supervisor.py) plus a control start
RECONNECT_TIMEOUT_S = 300.0
# a control process that reads nothing this long is stuck: the connection is dropped, and the
# reader's reconnect takes over (a blocking send held the trainer and heartbeat threads for good)
SEND_TIMEOUT_S = 30.0
RECONNECT_POLL_S = 0.2
# what a restarted control process must hear again: who this worker is, what it computes, the
# run's states it holds and, on a spare, what it copies (its latest report: the next may be a
# copy gap away)
SAID_ONCE = (Hello, ComputeReport, SavedReport, CopyReport)


class PlanInbox:
    """The latest plan message and the stop flag, shared between the reader and the trainer."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.latest: PlanMessage | None = None
        self.version = 0  # bumps on every new plan message
        self.stopped = False

    def put_plan(self, message: PlanMessage) -> None:
        with self._changed:
            self.latest, self.version = message, self.version + 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()

    def wait_newer(self, version: int, timeout_s: float | None = None) -> bool:
        """Wait until a plan newer than `version` arrives (True) or stop/timeout (False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while self.version <= version and not self.stopped:
                left_s = None if deadline is None else deadline - time.monotonic()
                if left_s is not None and left_s <= 0:
                    return False
                self._changed.wait(left_s)
            return self.version > version and not self.stopped


class IpcClient:
    """A connection to the control process; `send` is thread-safe, plans land in `inbox`."""

    def __init__(
        self,
        path: str,
        inbox: PlanInbox,
        connect_timeout_s: float = 30.0,
        on_run: Callable[[RunSpec], None] | None = None,
    ) -> None:
        """on_run: called (on the reader thread) with every run spec the control process sends
        ahead of the plans."""
        self.inbox = inbox
        self._on_run = on_run
        self._path = path
        self._lock = threading.Lock()
        self._said_once: dict[type, bytes] = {}  # SAID_ONCE messages, the latest of each kind
        sock = _connect(path, connect_timeout_s, lambda: False, waiting="the control process")
        if sock is None:
            raise UserError(
                f"--ipc {path}: no control process listened there in {connect_timeout_s:.0f} s"
            )
        self._sock: socket.socket | None = sock
        threading.Thread(target=self._read_forever, args=(sock,), daemon=True).start()

    def send(self, message: Message) -> None:
        line = encode(message)
        with self._lock:
            if isinstance(message, SAID_ONCE):
                self._said_once[type(message)] = line
            if self._sock is None:
                return  # the control process is restarting; it hears SAID_ONCE on reconnect
            try:
                _send_all(self._sock, line, SEND_TIMEOUT_S)
            except TimeoutError:
                log.warning("ipc: the control process read nothing for %.0f s", SEND_TIMEOUT_S)
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)  # the reader sees the end: reconnects
            except OSError as exc:
                log.warning("ipc send failed: %s", exc)

    def _read_forever(self, sock: socket.socket) -> None:
        while True:
            lines = LineBuffer()
            while data := _receive(sock):
                for line in lines.feed(data):
                    self._handle(line)
            with self._lock:
                self._sock = None
            sock.close()
            if self.inbox.stopped:
                return
            log.warning("ipc closed by the control process: waiting for it to come back")
            reconnected = self._reconnect()
            if reconnected is None:
                if not self.inbox.stopped:
                    log.warning(
                        "no control process came back within %.0f s; stopping",
                        RECONNECT_TIMEOUT_S,
                    )
                    self.inbox.stop()
                return
            sock = reconnected

    def _reconnect(self) -> socket.socket | None:
        sock = _connect(self._path, RECONNECT_TIMEOUT_S, lambda: self.inbox.stopped)
        if sock is None:
            return None
        with self._lock:
            try:
                for line in self._said_once.values():  # in the order first said: hello first
                    _send_all(sock, line, SEND_TIMEOUT_S)
            except OSError as exc:  # TimeoutError too: the next send finds out again
                log.warning("ipc send failed: %s", exc)
            self._sock = sock
        log.info("ipc: the control process is back")
        return sock

    def _handle(self, line: bytes) -> None:
        message = decode(line)
        if isinstance(message, PlanMessage):
            self.inbox.put_plan(message)
        elif isinstance(message, RunMessage):
            if self._on_run is not None:
                self._on_run(message.run)
        elif isinstance(message, Stop):
            self.inbox.stop()
        elif message is not None:
            log.warning("ipc: ignoring message of type %r", message.TYPE)


def _connect(
    path: str, timeout_s: float, give_up: Callable[[], bool], waiting: str = ""
) -> socket.socket | None:
    """A connection to the control process's socket once it listens (it may be starting or
    restarting); None after timeout_s or once give_up() holds. Given `waiting`, a wait past
    the first try says what it waits for (a worker started by hand waited without a word)."""
    deadline = time.monotonic() + timeout_s
    while not give_up():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
        if waiting:
            log.info("waiting up to %.0f s for %s at %s", timeout_s, waiting, path)
            waiting = ""
        if time.monotonic() > deadline:
            return None
        time.sleep(RECONNECT_POLL_S)
    return None


def _send_all(sock: socket.socket, data: bytes, timeout_s: float) -> None:
    """sendall, within `timeout_s` (TimeoutError past it); the socket stays blocking for its
    reader thread."""
    deadline = time.monotonic() + timeout_s
    view = memoryview(data)
    while view:
        left_s = deadline - time.monotonic()
        if left_s <= 0 or not select.select([], [sock], [], left_s)[1]:
            raise TimeoutError(f"{len(view)} bytes unsent after {timeout_s:.0f} s")
        try:
            view = view[sock.send(view, socket.MSG_DONTWAIT) :]
        except BlockingIOError:
            continue


def _receive(sock: socket.socket) -> bytes:
    """The next bytes from the control process; b"" once it is gone."""
    try:
        return sock.recv(65536)
    except OSError:
        return b""
