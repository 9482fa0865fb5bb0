"""The worker side of the control <-> worker IPC (records/messages.py): newline-delimited JSON over a
Unix socket. The worker connects, says hello, then receives plans and a stop; it sends metrics.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from p2ptrain.ipc_lines import LineBuffer, decode, encode
from p2ptrain.records import Message, PlanMessage, RunMessage, RunSpec, Stop

log = logging.getLogger(__name__)


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
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + connect_timeout_s
        while True:  # the control process may still be binding its socket
            try:
                self._sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        threading.Thread(target=self._read_forever, name="ipc-reader", daemon=True).start()

    def send(self, message: Message) -> None:
        line = encode(message)
        with self._lock:
            try:
                self._sock.sendall(line)
            except OSError as exc:
                log.warning("ipc send failed: %s", exc)

    def _read_forever(self) -> None:
        lines = LineBuffer()
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:  # control went away: nothing left to take orders from
                log.warning("ipc closed by the control process; stopping")
                self.inbox.stop()
                return
            for line in lines.feed(data):
                self._handle(line)

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
