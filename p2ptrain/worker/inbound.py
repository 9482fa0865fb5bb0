"""What the worker's inbound p2pd stream handlers share (pipeline frames, outer rounds, stage
states): the count of streams each peer has open (a flood is refused before anything is read),
a length-prefixed header read with a bound on its size and time, and one answer written before
the stream closes once its sender has closed its side.

Pure asyncio (no hivemind): the handlers' rules are testable over plain loopback sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass

from p2ptrain.errors import WireError
from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)

ANSWER_LINGER_S = 5.0  # for the sender to read our answer and close its side
# WireError is a ValueError; RecursionError: a decoder that let deep nesting through still
# costs its sender one refused message, not a handler's traceback
BAD_INPUT = (ValueError, RecursionError, OSError, TimeoutError, asyncio.IncompleteReadError)


class OpenStreams:
    """Inbound streams being served, per remote peer, and the streams refused unread."""

    def __init__(self, what: str) -> None:
        self.what = what  # for the refusals' log line: "frame streams"
        self.num_refused = 0
        self._log = SampledLog(log, logging.WARNING)
        self._open: dict[str, int] = {}

    def of(self, peer: str) -> int:
        return self._open.get(peer, 0)

    def total(self) -> int:
        return sum(self._open.values())

    @contextlib.contextmanager
    def serving(self, peer: str) -> Iterator[None]:
        """Count one stream of `peer` as open while the block runs."""
        self._open[peer] = self.of(peer) + 1
        try:
            yield
        finally:
            self._open[peer] -= 1
            if not self._open[peer]:
                del self._open[peer]

    def refused(self, peer: str) -> None:
        """Count a stream refused unread; a flood logs one line per hundred refusals."""
        self.num_refused += 1
        self._log.event("refused", "refused %s, the latest from %s", self.what, peer)


async def read_prefixed(
    reader: asyncio.StreamReader, length: struct.Struct, max_bytes: int, what: str
) -> bytes:
    """One message behind its length prefix; WireError past `max_bytes`, before reading it
    (IncompleteReadError if the stream ends first)."""
    (size,) = length.unpack(await reader.readexactly(length.size))
    if size > max_bytes:
        raise WireError(f"oversized {what}: {size} bytes")
    return await reader.readexactly(size)


@dataclass(frozen=True)
class Framing:
    """How one protocol's inbound messages start: a header behind a length prefix, of at most
    `max_header_bytes`; `rejected` is the answer that refuses a message."""

    what: str  # "frame", "outer round message": for errors and the log
    length: struct.Struct
    max_header_bytes: int
    rejected: bytes

    async def read_header(self, reader: asyncio.StreamReader, timeout_s: float) -> bytes:
        """A message's header bytes, within `timeout_s`; WireError if oversized."""
        async with asyncio.timeout(timeout_s):
            what = f"{self.what} header"
            return await read_prefixed(reader, self.length, self.max_header_bytes, what)

    async def answer(
        self,
        remote: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        serve: Awaitable[bytes],
    ) -> None:
        """Write the answer `serve` gives; for a message that is bad, cut short or too slow,
        log it and write `rejected` instead. Either way the stream closes after its sender's
        side."""
        try:
            writer.write(await serve)
        except BAD_INPUT as exc:
            log.warning("refused the %s of %s: %r", self.what, remote, exc)
            writer.write(self.rejected)
        finally:
            await close_after_sender(reader, writer)


async def close_after_sender(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, linger_s: float = ANSWER_LINGER_S
) -> None:
    """Close an inbound stream once its sender has closed its side (it does after reading our
    answer), or after `linger_s`: p2pd may reset a stream closed with the answer in flight.
    What is still unsent then is dropped (abort): a sender that stopped reading held the
    drain, and with it the stream's serving slot, for the worker's life."""
    flushed = False
    with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
        async with asyncio.timeout(linger_s):
            await writer.drain()
            flushed = True
            while await reader.read(65536):  # nothing is parsed
                pass
    end_stream(writer, flushed)


def completed(task: asyncio.Future[None]) -> bool:
    """Did `task` (a write and its drain) run to its end, without an error?"""
    return task.done() and not task.cancelled() and task.exception() is None


def end_stream(writer: asyncio.StreamWriter, flushed: bool) -> None:
    """Close a stream whose bytes all went out (`flushed`), else abort it: a closed transport
    with bytes still buffered stays open, holding them and its descriptor, until the far end
    reads, which a hostile one never does."""
    if flushed:
        writer.close()
    else:
        writer.transport.abort()
