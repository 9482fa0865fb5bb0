"""The outer rounds' streams kept open between messages (protocol `p2ptrain.outer-round.v2`,
worker/averaging/outer_link.py): a message after another to the same groupmate goes on a stream
its last one left idle instead of a new one.

Why: a round of a group of 8 is 21 messages out and 21 in a member, and a p2pd stream of its own
for each cost 6.3 ms of CPU a message (both ends: the daemons' stream open and protocol
negotiation, hivemind's control socket, the handler's start), against 0.8 ms for the same 56 kB
message on a stream kept open (2026-12-02, two daemons on loopback, 300 messages each way). On a
volunteer's 1/8 of a core that was most of a round's CPU.

A receiver closes a stream whose next header has not begun within IDLE_S; a sender reuses one
idle for less than REUSE_S (half that, so it is not closing under the message) and keeps at most
MAX_IDLE_PER_PEER a groupmate. Everything here runs on the transport's event loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from p2ptrain.worker.inbound import end_stream

IDLE_S = 30.0
REUSE_S = IDLE_S / 2
MAX_IDLE_PER_PEER = 2  # a sender uses at most outer_link.MAX_SENDS_PER_PEER at once

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class _Idle:
    stream: Stream
    since: float  # monotonic: when its last answer was read


class IdleStreams:
    """Per groupmate, the streams whose last message was answered and that may carry the next."""

    def __init__(self) -> None:
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
        if len(idle) >= MAX_IDLE_PER_PEER:
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
