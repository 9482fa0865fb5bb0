"""Outer rounds' messages over the worker's p2pd connections (protocol `p2ptrain.outer-round.v2`,
worker/averaging/outer_wire.py), beside the pipeline's frames on the same Transport.

A groupmate's messages go one after another on a stream kept open between them
(worker/kept_streams.py says what that saves), each answered before the next; a
groupmate of the last version (v1 only: one message a stream) is sent to as it expects, and its
streams are still served.

One link per Transport (the handler is registered once, for the worker's life); each session
tells its inbox which group to read. Every byte in and out is added to the transport's traffic
counters, so the workers' `link_bytes` (and bench scaleout's DP bytes) count the rounds.

A stream is read only from a member of the inbox's current group, at most MAX_INBOUND_PER_PEER
at once a peer; anyone else is answered BUSY before a byte is read (as pipeline frames are). A
kept stream's every message is screened alike: one from a peer no longer in the group is
answered BUSY and its stream closed; a bad one REJECTED and its stream closed.

Our sends share MAX_SENDERS threads; a peer holds at most MAX_SENDS_PER_PEER of them (its other
messages wait in its own queue), and a send's timeout runs from when it was handed to us: a
groupmate that reads every message but never answers holds 2 threads, not the pool (which has
2 for each of 64 groupmates), and its queued messages go once their time is up instead of
piling up round after round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import torch

from p2ptrain.errors import WireError
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.round_inbox import RoundInbox
from p2ptrain.worker.inbound import Framing, OpenStreams, end_stream
from p2ptrain.worker.kept_streams import IdleStreams, Stream, serve_kept

if TYPE_CHECKING:
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

    from p2ptrain.worker.pipeline.transport import Transport

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
FRAMING = Framing("outer round message", wire.HEADER_LEN, wire.MAX_HEADER_BYTES, wire.REJECTED)
MIN_RATE_BPS = 1e6  # a payload's read may take its size at this rate (plus the header's time)
RETRY_PAUSE_S = 0.3
# threads one peer's messages may hold: a groupmate that never answers (each send waits for its
# answer up to the round's whole join_s + transfer_s) held all 8 of a shared pool and stalled
# the honest ones
MAX_SENDS_PER_PEER = 2
# threads that push messages at once: 2 for each of up to 64 groupmates (threads start only
# when used; the pacer, not the pool, spaces a round's sends), so withholders hold only their
# own (a pool of 8 was held by 4 colluding ones)
MAX_SENDERS = MAX_SENDS_PER_PEER * 64
# a groupmate (of this version or the last, whose pool was 8) pushes at most 8 messages at
# once; room for as many streams closing
MAX_INBOUND_PER_PEER = 16
# a leaving worker waits this long at most for its messages still on their way (a groupmate's
# last round may need our reduced shard: our own round can be done before it is delivered)
LEAVING_SENDS_S = 10.0

_LINKS: dict[int, P2PRoundLink] = {}
_Queued = tuple[Future[None], bytes, float]  # a message's future, its bytes, its deadline


class P2PRoundLink:
    """RoundLink (worker/averaging/outer_attempt.py) over p2pd binary streams."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.peer_id = transport.peer_id
        self.inbox = RoundInbox()
        self._streams = OpenStreams("outer round streams")  # strangers' and over the cap
        self._pool = ThreadPoolExecutor(MAX_SENDERS, thread_name_prefix="outer-send")
        self._in_flight: set[Future[None]] = set()  # added here, discarded by the senders
        self._in_flight_lock = threading.Lock()
        # by peer: its messages not handed to the pool yet, and how many the pool holds
        self._waiting: dict[str, deque[_Queued]] = {}
        self._sending: dict[str, int] = {}
        self._queue_lock = threading.Lock()
        self._idle = IdleStreams()  # on the transport's loop only
        self._one_shot: set[str] = set()  # groupmates that speak v1 only
        transport.call(transport.p2p.add_binary_stream_handler(wire.PROTOCOL, self._handle))
        transport.call(
            transport.p2p.add_binary_stream_handler(wire.STREAM_PROTOCOL, self._handle_stream)
        )

    @classmethod
    def of(cls, transport: Transport) -> P2PRoundLink:
        """The transport's link (created on first use)."""
        link = _LINKS.get(id(transport))
        if link is None or link.transport is not transport:
            link = _LINKS[id(transport)] = cls(transport)
        return link

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        """Deliver one message, retried while the peer is busy or unreachable, until
        timeout_s from now; the future fails then (the round notices the missing message
        itself)."""
        data = header.encode() + payload.numpy().tobytes()
        sent: Future[None] = Future()
        with self._in_flight_lock:
            self._in_flight.add(sent)
        sent.add_done_callback(self._sent)
        with self._queue_lock:
            self._waiting.setdefault(peer, deque()).append(
                (sent, data, time.monotonic() + timeout_s)
            )
        self._dispatch(peer)
        return sent

    def _dispatch(self, peer: str) -> None:
        """Hand `peer`'s next messages to the pool while it holds under MAX_SENDS_PER_PEER;
        those whose time is up go unsent (their payload with them)."""
        with self._queue_lock:
            now, queued = time.monotonic(), self._waiting.get(peer, deque())
            expired = [sent for sent, _, deadline in queued if deadline <= now]
            queue = deque(item for item in queued if item[2] > now)
            self._waiting[peer] = queue
            while queue and self._sending.get(peer, 0) < MAX_SENDS_PER_PEER:
                sent, data, deadline = queue.popleft()
                if sent.set_running_or_notify_cancel():
                    self._sending[peer] = self._sending.get(peer, 0) + 1
                    self._pool.submit(self._run, peer, sent, data, deadline)
            if not queue:
                self._waiting.pop(peer, None)
        for sent in expired:  # outside the lock: done callbacks run here
            if sent.set_running_or_notify_cancel():
                sent.set_exception(TimeoutError(f"an outer round message to {peer} timed out"))

    def _run(self, peer: str, sent: Future[None], data: bytes, deadline: float) -> None:
        try:
            left_s = deadline - time.monotonic()  # time spent in the pool's queue counts
            if left_s <= 0:
                raise TimeoutError(f"an outer round message to {peer} timed out")
            self._send_until(peer, data, left_s)
        except BaseException as exc:  # the caller reads the outcome from the future
            sent.set_exception(exc)
        else:
            sent.set_result(None)
        finally:
            with self._queue_lock:
                self._sending[peer] -= 1
                if not self._sending[peer]:
                    del self._sending[peer]
            self._dispatch(peer)

    def _sent(self, sent: Future[None]) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(sent)

    def finish_sends(self, timeout_s: float) -> None:
        """Wait up to timeout_s for the messages still on their way (each ends delivered or
        timed out on its own)."""
        with self._in_flight_lock:
            pending = set(self._in_flight)
        if pending:
            log.info("leaving: %d outer round messages still on their way", len(pending))
            wait(pending, timeout_s)

        async def close_idle() -> None:
            self._idle.close_all()

        with contextlib.suppress(Exception):  # the transport may be gone already
            self.transport.call(close_idle(), 5.0)

    def _send_until(self, peer: str, data: bytes, timeout_s: float) -> None:
        async def deliver() -> None:
            async with asyncio.timeout(timeout_s):
                while True:
                    answer = b""
                    with contextlib.suppress(Exception):  # p2pd raises several kinds
                        answer = await self._send_once(peer, data)
                    if answer == wire.ACCEPTED:
                        return
                    if answer == wire.REJECTED:
                        raise WireError(f"{peer} refused an outer round message")
                    await asyncio.sleep(RETRY_PAUSE_S)

        self.transport.call(deliver(), timeout_s + 5.0)

    async def _send_once(self, peer: str, data: bytes) -> bytes:
        """One try: on a stream the last message left idle (one closed meanwhile costs a fresh
        one, not a retry's pause), else a new one; the answer."""
        idle = self._idle.take(peer)
        if idle is not None:
            with contextlib.suppress(Exception):  # p2pd raises several kinds
                return await self._send_on(peer, idle, data, keep=True)
        if peer in self._one_shot:
            return await self._send_on(
                peer, await self.transport.open_stream(peer, wire.PROTOCOL), data
            )
        try:
            stream = await self.transport.open_stream(peer, wire.STREAM_PROTOCOL)
        except Exception:  # unreachable, or a groupmate of the last version
            stream = await self.transport.open_stream(peer, wire.PROTOCOL)
            self._one_shot.add(peer)  # it answered on v1: it does not speak v2
            return await self._send_on(peer, stream, data)
        return await self._send_on(peer, stream, data, keep=True)

    async def _send_on(self, peer: str, stream: Stream, data: bytes, keep: bool = False) -> bytes:
        """Write one message on `stream` and read its answer; a stream kept (`keep`, after an
        answer that leaves it open) carries the next message, any other ends here."""
        reader, writer = stream
        flushed = kept = False
        try:
            writer.write(data)
            await writer.drain()
            flushed = True
            self.transport.traffic.sent(peer, len(data))  # every copy crossed the link
            answer = await reader.readexactly(1)
            if keep and answer == wire.ACCEPTED:  # else its payload went unread: it closes
                self._idle.put(peer, stream)
                kept = True
            return answer
        finally:
            if not kept:
                end_stream(writer, flushed)  # an untaken payload goes with its stream

    async def _handle(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = info.peer_id.to_base58()
        if self._refused(remote, writer):
            return
        with self._streams.serving(remote):
            await FRAMING.answer(remote, reader, writer, self._read_message(remote, reader))

    async def _handle_stream(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A v2 stream: messages one after another (worker/kept_streams.py)."""
        remote = info.peer_id.to_base58()
        if self._refused(remote, writer):
            return
        with self._streams.serving(remote):
            await serve_kept(
                FRAMING,
                remote,
                (reader, writer),
                lambda raw: self._read_body(remote, reader, raw),
                lambda: self.inbox.is_member(remote),
                wire.ACCEPTED,
                HEADER_TIMEOUT_S,
            )

    def _refused(self, remote: str, writer: asyncio.StreamWriter) -> bool:
        """Answer and close a stream of `remote` not to be read at all (nothing of it is)."""
        refusal = self._refusal(remote)
        if refusal is None:
            return False
        self._streams.refused(remote)
        writer.write(refusal)
        writer.close()
        return True

    def _refusal(self, remote: str) -> bytes | None:
        """The answer to a stream of `remote` not to be read at all, or None."""
        if not self.inbox.is_member(remote):
            return wire.BUSY  # a groupmate of a newer plan retries; anyone else gets nothing
        if self._streams.of(remote) >= MAX_INBOUND_PER_PEER:
            return wire.BUSY  # an honest groupmate never gets here; it would retry
        return None

    async def _read_message(self, remote: str, reader: asyncio.StreamReader) -> bytes:
        """Read, screen and file one round message; the answer to send back."""
        return await self._read_body(
            remote, reader, await FRAMING.read_header(reader, HEADER_TIMEOUT_S)
        )

    async def _read_body(self, remote: str, reader: asyncio.StreamReader, raw: bytes) -> bytes:
        """Screen the message whose header is `raw`, read and file its payload; the answer."""
        self.transport.traffic.received(remote, wire.HEADER_LEN.size + len(raw))
        header = wire.RoundHeader.decode(raw)
        answer = self.inbox.screen(header, remote)
        if answer is not None:
            return answer
        try:  # the screen reserved the sender's place: a failed read gives it back
            async with asyncio.timeout(HEADER_TIMEOUT_S + header.num_bytes * 8 / MIN_RATE_BPS):
                payload = await reader.readexactly(header.num_bytes)
            self.transport.traffic.received(remote, len(payload))
            self.inbox.put(header, payload)
        finally:
            self.inbox.release(header)  # after put: nothing left to release
        return wire.ACCEPTED


def close_rounds(transport: Transport) -> None:
    """A session ends: its group's messages are refused from now on (a groupmate of the next
    plan is busy-refused until that session admits it, and retries), and what they parked
    goes. A former groupmate kept parking messages, 8 of its largest payload each, for as long
    as no later DiLoCo session admitted another group."""
    link = _LINKS.get(id(transport))
    if link is not None and link.transport is transport:
        link.inbox.admit_group((), 0)


def finish_sends(transport: Transport) -> None:
    """The worker leaves: our round messages still on their way get LEAVING_SENDS_S at most."""
    link = _LINKS.get(id(transport))
    if link is not None and link.transport is transport:
        link.finish_sends(LEAVING_SENDS_S)
