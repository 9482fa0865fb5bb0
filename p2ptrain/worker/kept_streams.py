"""Streams kept open between messages, for the data plane's two message protocols: pipeline
frames (`p2ptrain.pipe.v4`, worker/pipeline/transport.py) and outer rounds'
messages (`p2ptrain.outer-round.v2`, worker/averaging/outer_link.py). A message after another
to the same peer goes on a stream its last one left idle instead of a new one.

Why: a p2pd stream of its own for each message cost 6.3 ms of CPU a message (both ends: the
daemons' stream open and protocol negotiation, hivemind's control socket, the handler's start),
against 0.8 ms for the same 56 kB message on a stream kept open (2026-12-02, two daemons on
loopback, 300 messages each way). On a volunteer's 1/8 of a core that was most of an outer
round's CPU, and up to half a pipeline stage's besides its passes.

The sender (IdleStreams) writes a message only on a stream whose last one was answered KEEP
(the receiver read it whole and goes on reading); the receiver (`serve_kept`) screens every
message as a stream's first, ends the stream on any other answer (its payload was left unread)
or a bad message, and closes one whose next header has not begun within IDLE_S. A sender
reuses a stream idle for less than REUSE_S (half that, so it is not closing under the message)
and keeps at most `max_idle` a peer. Everything here runs on the transport's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from p2ptrain.worker.inbound import BAD_INPUT, Framing, close_after_sender, end_stream

log = logging.getLogger(__name__)

IDLE_S = 30.0
REUSE_S = IDLE_S / 2
MAX_IDLE_PER_PEER = 2  # outer rounds: a sender uses at most outer_link.MAX_SENDS_PER_PEER at once

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class _Idle:
    stream: Stream
    since: float  # monotonic: when its last answer was read


class IdleStreams:
    """Per peer, the streams whose last message was answered and that may carry the next."""

    def __init__(self, max_idle: int = MAX_IDLE_PER_PEER) -> None:
        self.max_idle = max_idle
        self._by_peer: dict[str, list[_Idle]] = {}

    def take(self, peer: str) -> Stream | None:
        """An idle stream to `peer` still fit to carry a message (None: open a new one); the
        ones past REUSE_S or closed by the far end, to anyone, are closed on the way."""
        self._sweep(time.monotonic())
        idle = self._by_peer.get(peer)
        if not idle:
            return None
        stream = idle.pop().stream
        if not idle:
            del self._by_peer[peer]
        return stream

    def put(self, peer: str, stream: Stream) -> None:
        """`stream`'s message was answered: it may carry the next (or close, if enough wait)."""
        idle = self._by_peer.setdefault(peer, [])
        if len(idle) >= self.max_idle:
            end_stream(stream[1], flushed=True)
            return
        idle.append(_Idle(stream, time.monotonic()))

    def close_all(self) -> None:
        for idle in self._by_peer.values():
            for entry in idle:
                end_stream(entry.stream[1], flushed=True)
        self._by_peer.clear()

    def count(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def _sweep(self, now: float) -> None:
        for peer, idle in list(self._by_peer.items()):
            fit = []
            for entry in idle:
                if _fit(entry, now):
                    fit.append(entry)
                else:
                    end_stream(entry.stream[1], flushed=True)
            if fit:
                self._by_peer[peer] = fit
            else:
                del self._by_peer[peer]


def _fit(entry: _Idle, now: float) -> bool:
    reader, writer = entry.stream
    return now - entry.since < REUSE_S and not reader.at_eof() and not writer.is_closing()


async def serve_kept(
    framing: Framing,
    remote: str,
    stream: Stream,
    read_body: Callable[[bytes], Awaitable[bytes]],
    go_on: Callable[[], bool],
    keep: bytes,
    header_timeout_s: float,
) -> None:
    """Serve one kept inbound stream of `remote`: messages one after another, each one's header
    handed to `read_body` (which screens it, reads and files its payload, and gives the answer),
    until the sender closes it, an answer is not `keep` (its payload went unread), `go_on()` no
    longer holds (the peer left the group or plan), a message is bad (answered
    `framing.rejected`), or none begins within IDLE_S."""
    reader, writer = stream
    first = True
    try:
        while True:
            try:
                header_s = header_timeout_s if first else IDLE_S + header_timeout_s
                raw = await framing.read_header(reader, header_s)
            except (TimeoutError, asyncio.IncompleteReadError):
                if first:
                    raise
                writer.close()  # idle past IDLE_S, or closed by its sender: no error
                return
            first = False
            answer = await read_body(raw)
            writer.write(answer)
            if answer != keep or not go_on():
                break  # a payload left unread, or the peer is gone: the stream ends
            async with asyncio.timeout(header_timeout_s):
                await writer.drain()
    except BAD_INPUT as exc:
        log.warning("refused the %s of %s: %r", framing.what, remote, exc)
        writer.write(framing.rejected)
    await close_after_sender(reader, writer)
