"""Accept loops that a flood of connections cannot end, with caps per source address and in all.

`accept` raises `EMFILE` once the process is out of file descriptors (1,024 by default for a
service): escaping the loop, it ended the node. Here the loop logs, backs off briefly and goes
on serving; each accepted connection beyond its source's share (an IPv4 address, an IPv6 /64),
its public prefix's (a /24, an IPv6 /48: one operator holds many addresses there cheaply; none on
loopback or a private network) or the total is closed at once, and every connection is served
under the guard (net/guard.py): its failure ends only itself. A handler may move its connection
to other caps (`current_seat().move`): the relay port admits into a small pool for connections
still waiting for their hello, and a circuit's half moves to the circuits' pool.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import trio

from p2ptrain.net.address_classes import public_prefix
from p2ptrain.net.guard import start_contained
from p2ptrain.net.inbound_gate import source_of
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
    """Connections open at once: at most `per_source` from one source, `per_prefix` (None: no
    cap) from one public prefix, `total` in all."""

    per_source: int
    total: int
    per_prefix: int | None = None
    open_by_source: dict[str, int] = field(default_factory=dict)
    open_by_prefix: dict[str, int] = field(default_factory=dict)
    refused: int = 0

    @property
    def open(self) -> int:
        return sum(self.open_by_source.values())

    def admit(self, source: str, prefix: str = "") -> bool:
        """Count a new connection from `source` in `prefix` ('' : none) in, or say no (nothing
        is counted then)."""
        if (
            self.open >= self.total
            or self.open_by_source.get(source, 0) >= self.per_source
            or (
                prefix
                and self.per_prefix is not None
                and self.open_by_prefix.get(prefix, 0) >= self.per_prefix
            )
        ):
            self.refused += 1
            return False
        self.open_by_source[source] = self.open_by_source.get(source, 0) + 1
        if prefix:
            self.open_by_prefix[prefix] = self.open_by_prefix.get(prefix, 0) + 1
        return True

    def release(self, source: str, prefix: str = "") -> None:
        _decrement(self.open_by_source, source)
        if prefix:
            _decrement(self.open_by_prefix, prefix)


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


@dataclass
class Seat:
    """One served connection's place in some caps, given back when it ends."""

    caps: ConnectionCaps
    source: str
    prefix: str

    def move(self, caps: ConnectionCaps) -> bool:
        """Take a place in `caps` and give this one back; False (and stay) if `caps` is full."""
        if caps is self.caps:
            return True
        if not caps.admit(self.source, self.prefix):
            return False
        self.caps.release(self.source, self.prefix)
        self.caps = caps
        return True


# set in each served connection's task (each trio task has its own context)
_SEAT: ContextVar[Seat | None] = ContextVar("p2ptrain_accepted_seat", default=None)


def current_seat() -> Seat | None:
    """The place of the connection this task serves (None outside serve_accepting)."""
    return _SEAT.get()


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
            ip = _ip_of(stream)
            seat = Seat(caps, source_of(ip) or ip, public_prefix(ip) if ip else "")
            if not caps.admit(seat.source, seat.prefix):
                stream.socket.close()  # at once: a flood holds nothing
                sampled.event("refused", "%s: refused connections over the caps", what)
                continue
            start_contained(nursery, what, _served, handle, stream, seat)


async def _served(handle: Handler, stream: trio.SocketStream, seat: Seat) -> None:
    _SEAT.set(seat)
    try:
        await handle(stream)
    finally:
        seat.caps.release(seat.source, seat.prefix)
        stream.socket.close()


def _ip_of(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:  # reset before we asked
        return ""
