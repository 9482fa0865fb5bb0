"""The control side of the control <-> worker IPC: a Unix socket, newline-delimited JSON.

Messages (records/messages.py): worker -> control `hello`, `metrics`; control -> worker `plan`,
`stop`. Each line is at most 1 MiB; a bad line is logged and skipped, never fatal.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from p2ptrain.ipc_lines import LineBuffer, decode, encode
from p2ptrain.records import Message, PlanMessage, RunMessage

log = logging.getLogger(__name__)


Handler = Callable[[Message], None]


SEND_TIMEOUT_S = 30.0  # a worker that reads nothing this long (frozen, or not one) is dropped


@dataclass
class _Client:
    """One connection and what is still to be written to it, in order; a newer run spec or plan
    takes the place of one not written yet (each `Sent` is set once its line is out, or the
    client is gone)."""

    stream: trio.SocketStream
    pending: list[tuple[str, bytes, trio.Event]] = field(default_factory=list)
    wake: trio.Event = field(default_factory=trio.Event)

    def put(self, kind: str, line: bytes) -> trio.Event:
        sent = trio.Event()
        if kind in LATEST_ONLY:
            for _, _, replaced in [p for p in self.pending if p[0] == kind]:
                replaced.set()  # superseded: what it carried goes with the newer line
            self.pending = [p for p in self.pending if p[0] != kind]
        self.pending.append((kind, line, sent))
        self.wake.set()
        return sent


LATEST_ONLY = ("run", "plan")  # kinds where only the newest line matters


class IpcServer:
    """Accepts worker connections; forwards their messages to `on_message`, broadcasts to them.
    Each connection has a writer of its own: a worker that does not read delays nobody (it is
    dropped after SEND_TIMEOUT_S), and a line written while another is being written waits its
    turn (it was dropped, and the worker kept the previous plan)."""

    def __init__(self, path: str, on_message: Handler) -> None:
        self.path = path
        self._on_message = on_message
        self._clients: list[_Client] = []
        self._last_plan: bytes | None = None
        self._last_run: bytes | None = None

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the socket path until cancelled (the stale socket file is replaced)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a stale socket from a killed run
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(self.path)
        os.chmod(self.path, 0o600)
        sock.listen(4)
        listener = trio.SocketListener(sock)
        task_status.started()
        try:
            await trio.serve_listeners(self._handle_client, [listener])
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    async def _handle_client(self, stream: trio.SocketStream) -> None:
        client = _Client(stream)
        for kind, replay in (("run", self._last_run), ("plan", self._last_plan)):
            if replay is not None:
                client.put(kind, replay)
        self._clients.append(client)
        try:
            # each side ends the connection on its own failure (a worker gone, a reset): caught
            # inside, as a nursery would raise it grouped
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, client, nursery.cancel_scope)
                await self._read(stream)
                nursery.cancel_scope.cancel()
        finally:
            self._clients.remove(client)
            for _, _, sent in client.pending:
                sent.set()  # nobody waits on a gone worker
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _read(self, stream: trio.SocketStream) -> None:
        lines = LineBuffer()
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await stream.receive_some(65536):
                for line in lines.feed(data):
                    self._handle_line(line)

    async def _write(self, client: _Client, scope: trio.CancelScope) -> None:
        while True:
            await client.wake.wait()
            client.wake = trio.Event()
            while client.pending:
                _, line, sent = client.pending.pop(0)
                with trio.move_on_after(SEND_TIMEOUT_S) as timer:
                    try:
                        await client.stream.send_all(line)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        sent.set()
                        scope.cancel()  # the worker is gone: the reader ends too
                        return
                sent.set()
                if timer.cancelled_caught:
                    log.warning(
                        "the worker read nothing for %.0f s: its connection is dropped",
                        SEND_TIMEOUT_S,
                    )
                    scope.cancel()
                    return

    def _handle_line(self, line: bytes) -> None:
        message = decode(line)
        if message is not None:
            self._on_message(message)

    async def send(self, message: Message, wait: bool = False) -> None:
        """Send a message to every connected worker (the run spec and the plan are also replayed
        to late joiners); `wait`: until it is written (or the worker gone, or SEND_TIMEOUT_S)."""
        line = encode(message)
        kind = "other"
        if isinstance(message, PlanMessage):
            self._last_plan, kind = line, "plan"
        elif isinstance(message, RunMessage):
            self._last_run, kind = line, "run"
        sent = [client.put(kind, line) for client in self._clients]
        if wait:
            with trio.move_on_after(SEND_TIMEOUT_S):
                for event in sent:
                    await event.wait()
