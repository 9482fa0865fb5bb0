"""Accept loops that a flood of connections cannot end, with caps per source address and in all.

`accept` raises `EMFILE` once the process is out of file descriptors (1,024 by default for a
service): escaping the loop, it ended the node. Here the loop logs, backs off briefly and goes
on serving; each accepted connection beyond its source's share or the total is closed at once,
and every connection is served under the guard (net/guard.py): its failure ends only itself.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from p2ptrain.net.guard import start_contained
from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)

# out of descriptors or buffers, or a connection that died in the backlog: the next accept may
# well succeed once some connection has closed
TRANSIENT_ACCEPT_ERRNOS = frozenset(
    code
    for code in (
        getattr(errno, name, None)
        for name in ("EMFILE", "ENFILE", "ENOBUFS", "ENOMEM", "ECONNABORTED", "EPROTO")
    )
    if code is not None
)
ACCEPT_BACKOFF_S = 0.1


@dataclass
class ConnectionCaps:
    """Connections open at once: at most `per_source` from one address, `total` in all."""

    per_source: int
    total: int
    open_by_source: dict[str, int] = field(default_factory=dict)
    refused: int = 0

    @property
    def open(self) -> int:
        return sum(self.open_by_source.values())

    def admit(self, source: str) -> bool:
        """Count a new connection from `source` in, or say no (nothing is counted then)."""
        if self.open >= self.total or self.open_by_source.get(source, 0) >= self.per_source:
            self.refused += 1
            return False
        self.open_by_source[source] = self.open_by_source.get(source, 0) + 1
        return True

    def release(self, source: str) -> None:
        left = self.open_by_source.get(source, 0) - 1
        if left > 0:
            self.open_by_source[source] = left
        else:
            self.open_by_source.pop(source, None)


Handler = Callable[[trio.SocketStream], Awaitable[Any]]


async def serve_accepting(
    listener: trio.SocketListener,
    handle: Handler,
    caps: ConnectionCaps,
    what: str,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections until cancelled, each served by `handle` within `caps`."""
    async with trio.open_nursery() as nursery:
        task_status.started()
        sampled = SampledLog(log, logging.WARNING)  # a flood is not a log flood
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in TRANSIENT_ACCEPT_ERRNOS:
                    raise
                sampled.event("failed", "%s: accept failed, backing off: %s", what, exc)
                await trio.sleep(ACCEPT_BACKOFF_S)
                continue
            source = _source_of(stream)
            if not caps.admit(source):
                stream.socket.close()  # at once: a flood holds nothing
                sampled.event("refused", "%s: refused connections over the caps", what)
                continue
            start_contained(nursery, what, _served, handle, stream, caps, source)


async def _served(
    handle: Handler, stream: trio.SocketStream, caps: ConnectionCaps, source: str
) -> None:
    try:
        await handle(stream)
    finally:
        caps.release(source)
        stream.socket.close()


def _source_of(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:  # reset before we asked
        return ""
