"""Inbound frame streams of one worker (the Transport's receiving side): whose streams are read
at all, and each frame on them checked, read and filed in the inbox the trainer takes from.

A stream of pipe.v3 carries one frame; one of pipe.v4 a neighbour's frames one after another
(worker/kept_streams.py). Every frame is checked before its payload is read
(worker/pipeline/frames.py says against what), and a copy of a frame that is held already, or
being read on another stream, is not filed twice. Everything here runs on the transport's
event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from p2ptrain.errors import WireError
from p2ptrain.worker.inbound import Framing, OpenStreams
from p2ptrain.worker.kept_streams import serve_kept
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frame_inbox import FrameInbox, Key
from p2ptrain.worker.pipeline.frames import Expected, FrameHeader
from p2ptrain.worker.pipeline.link_bounds import MIN_LINK_RATE_MBPS, SEND_TIMEOUT_S
from p2ptrain.worker.traffic import Traffic

if TYPE_CHECKING:
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

ExpectFn = Callable[[FrameHeader], Expected | None]
# Only the current plan's peers get a stream read at all; a neighbour has a handful open at
# once (a frame per micro-batch and direction, and up to 4 idle: transport.py), so more than
# this is a flood and refused before anything is read; and a header must arrive soon after a
# stream opens, so idle streams cannot hold handlers.
MAX_INBOUND_PER_PEER = 16
HEADER_TIMEOUT_S = 10.0
# a payload's read may take its size at this rate (a minute at least): a hop's frame waits
# assume no slower link either (link_bounds.py)
MIN_RATE_BPS = MIN_LINK_RATE_MBPS * 1e6
FRAMING = Framing("frame", frames.HEADER_LEN, frames.MAX_HEADER_BYTES, frames.REJECTED)


class FrameIntake:
    """The frames a worker accepts; `expect` says what is acceptable right now."""

    def __init__(self, expect: ExpectFn, traffic: Traffic) -> None:
        self.inbox = FrameInbox()  # what was accepted: the trainer takes from it
        self.plan_peers: frozenset[str] = frozenset()  # whose frames we read at all
        self.traffic = traffic
        self._expect = expect
        self._reading: set[Key] = set()  # frames whose payload a stream is reading now
        self._streams = OpenStreams("frame streams over the caps")

    @property
    def num_refused(self) -> int:
        return self._streams.num_refused

    async def handle_stream(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A pipe.v3 stream: one frame (a neighbour of the last version sends them so)."""
        remote = info.peer_id.to_base58()
        if self._refused(remote, writer):
            return
        with self._streams.serving(remote):
            await FRAMING.answer(remote, reader, writer, self.read_frame(remote, reader))

    async def handle_kept_stream(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A pipe.v4 stream: frames one after another (worker/kept_streams.py), while the
        sender stays a peer of our plan."""
        remote = info.peer_id.to_base58()
        if self._refused(remote, writer):
            return
        with self._streams.serving(remote):
            await serve_kept(
                FRAMING,
                remote,
                (reader, writer),
                lambda raw: self._read_body(remote, reader, raw, kept=True),
                lambda: remote in self.plan_peers,
                frames.ACCEPTED,
                HEADER_TIMEOUT_S,
            )

    def _refused(self, remote: str, writer: asyncio.StreamWriter) -> bool:
        """Answer and close a stream of `remote` not to be read at all (nothing of it is)."""
        if remote not in self.plan_peers:
            # not (yet) a peer of our plan: a neighbour of a newer plan retries on BUSY until
            # we have that plan too; anyone else gets nothing read
            writer.write(frames.BUSY)
            writer.close()
            return True
        if self._streams.of(remote) >= MAX_INBOUND_PER_PEER:
            self._streams.refused(remote)
            writer.write(frames.REJECTED)
            writer.close()
            return True
        return False

    async def read_frame(self, remote: str, reader: asyncio.StreamReader) -> bytes:
        """Read, check and file one frame of a pipe.v3 stream; the answer to send back."""
        raw = await FRAMING.read_header(reader, HEADER_TIMEOUT_S)
        return await self._read_body(remote, reader, raw)

    async def _read_body(
        self, remote: str, reader: asyncio.StreamReader, raw: bytes, kept: bool = False
    ) -> bytes:
        """Check the frame whose header is `raw`, read and file its payload; the answer. On a
        kept stream (pipe.v4) ACCEPTED means the payload was read (a copy of a frame we have
        is read and dropped, so the stream goes on); every other answer leaves it unread."""
        self.traffic.received(remote, frames.HEADER_LEN.size + len(raw))
        if kept and remote not in self.plan_peers:
            return frames.BUSY  # left our plan since its stream opened: as a new stream would be
        header = FrameHeader.decode(raw)
        try:
            expected = self._expect(header)
        except frames.NotReady:
            return frames.BUSY  # before reading the payload: the sender retries
        except frames.AlreadyHave:
            return await self._skip_payload(remote, reader, header) if kept else frames.ACCEPTED
        problem = frames.check_header(header, remote, expected)
        if problem is not None or expected is None:
            raise WireError(f"malformed frame: {problem}")  # a BAD_INPUT: answered REJECTED
        # a copy of a frame here already, or being read: nothing more is read (16 copies of
        # one frame on a neighbour's streams each took the frame's size three times over)
        key = FrameInbox.key_of(header)
        if self.inbox.holds(header):
            # a retry whose first copy arrived: the first stays
            return await self._skip_payload(remote, reader, header) if kept else frames.ACCEPTED
        if key in self._reading:
            return frames.BUSY  # the sender retries once the first copy is in (or failed)
        self._reading.add(key)
        try:
            payload = await self._read_payload(reader, header)
        finally:
            self._reading.discard(key)
        self.traffic.received(remote, len(payload))
        self.inbox.put(header, frames.decode_tensor(header, payload, expected.max_abs))
        return frames.ACCEPTED

    async def _skip_payload(
        self, remote: str, reader: asyncio.StreamReader, header: FrameHeader
    ) -> bytes:
        """Read and drop the payload of a copy we do not need (a kept stream goes on)."""
        self.traffic.received(remote, len(await self._read_payload(reader, header)))
        return frames.ACCEPTED

    async def _read_payload(self, reader: asyncio.StreamReader, header: FrameHeader) -> bytes:
        # the payload at the slowest rate a hop may have: a slow link's large frame took
        # longer than a fixed minute, and every copy was cut short
        async with asyncio.timeout(max(SEND_TIMEOUT_S, header.num_bytes * 8 / MIN_RATE_BPS)):
            return await reader.readexactly(header.num_bytes)
