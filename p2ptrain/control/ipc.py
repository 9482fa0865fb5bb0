"""The control side of the control <-> worker IPC: a Unix socket, newline-delimited JSON.

Messages (records/messages.py): worker -> control `hello`, `metrics`; control -> worker `plan`,
`stop`. Each line is at most 1 MiB; a bad line is logged and skipped, never fatal.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

import trio

from p2ptrain.ipc_lines import LineBuffer, decode, encode
from p2ptrain.records import Message, PlanMessage, RunMessage

log = logging.getLogger(__name__)


Handler = Callable[[Message], None]


class IpcServer:
    """Accepts worker connections; forwards their messages to `on_message`, broadcasts to them."""

    def __init__(self, path: str, on_message: Handler) -> None:
        self.path = path
        self._on_message = on_message
        self._clients: list[trio.SocketStream] = []
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
        self._clients.append(stream)
        try:
            for replay in (self._last_run, self._last_plan):
                if replay is not None:
                    await stream.send_all(replay)
            lines = LineBuffer()
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                for line in lines.feed(data):
                    self._handle_line(line)
        except trio.BrokenResourceError:
            return
        finally:
            self._clients.remove(stream)

    def _handle_line(self, line: bytes) -> None:
        message = decode(line)
        if message is not None:
            self._on_message(message)

    async def send(self, message: Message) -> None:
        """Send a message to every connected worker (the run spec and the plan are also replayed
        to late joiners)."""
        line = encode(message)
        if isinstance(message, PlanMessage):
            self._last_plan = line
        elif isinstance(message, RunMessage):
            self._last_run = line
        for client in list(self._clients):
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError
            ):
                await client.send_all(line)
