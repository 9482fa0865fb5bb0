"""Pipeline transport: tensor frames to and from neighbours over hivemind's p2pd streams.

hivemind's P2P client is asyncio; the trainer is plain blocking code. So the transport owns an
asyncio loop in a background thread: a stream handler validates incoming frames and files them in
an inbox keyed by plan (term, epoch), kind, step and micro-batch (worker/pipeline/frame_inbox.py); the
trainer sends with `send()` (returns a future) and blocks in `inbox.take()` until the frame it
needs arrives, the peer is declared lost, or it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

import torch
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.utils.multiaddr import Multiaddr

from p2ptrain.errors import WireError
from p2ptrain.worker.inbound import Framing, OpenStreams, completed, end_stream
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frame_inbox import FrameInbox, Key, PlanKey
from p2ptrain.worker.pipeline.frames import Expected, FrameHeader, PeerLost
from p2ptrain.worker.pipeline.link_bounds import (
    CONNECT_WINDOW_S,
    MIN_LINK_RATE_MBPS,
    SEND_TIMEOUT_S,
)
from p2ptrain.worker.traffic import Traffic

log = logging.getLogger(__name__)

T = TypeVar("T")
ExpectFn = Callable[[FrameHeader], Expected | None]
BUSY_RETRY_S = 0.2
YIELD_DIAL_S = (2.0, 3.0)  # how long the larger peer id leaves the dial to the other one
# Inbound frame streams: only the current plan's peers get a stream read at all; a neighbour
# has a handful open at once (a frame per micro-batch and direction), so more than this is a
# flood and refused before anything is read; and a header must arrive soon after a stream
# opens, so idle streams cannot hold handlers.
MAX_INBOUND_PER_PEER = 16
HEADER_TIMEOUT_S = 10.0
# a payload's read may take its size at this rate (a minute at least): a hop's frame waits
# assume no slower link either (link_bounds.py)
MIN_RATE_BPS = MIN_LINK_RATE_MBPS * 1e6
FRAMING = Framing("frame", frames.HEADER_LEN, frames.MAX_HEADER_BYTES, frames.REJECTED)
ROUTE_CHECK_S = 2.0  # how often routed peers' connections are checked (keep_routes)
DIAL_POLL_S = 0.2  # how often connect_all asks whether to stop dialling


def transport_addrs(maddrs: Sequence[str]) -> list[Multiaddr]:
    """The addresses p2pd dials for a peer's multiaddrs: each without its trailing /p2p/<id>.
    One the parser refuses is left out: records check every address (records/multiaddrs.py),
    but a dial must never be where a bad one ends the worker."""
    addrs = []
    for text in maddrs:
        try:
            addrs.append(Multiaddr(text.split("/p2p/")[0]))
        except Exception as exc:  # multiaddr raises several unrelated types
            log.warning("not dialling %r: %s", text[:100], exc)
    return addrs


class Transport:
    """Frames in and out of one worker; `expect` says what is acceptable right now."""

    def __init__(self, loop: asyncio.AbstractEventLoop, p2p: P2P, expect: ExpectFn) -> None:
        self._loop = loop
        self._p2p = p2p
        self._expect = expect
        self.inbox = FrameInbox()  # what the handler accepted: the trainer takes from it
        self._reading: set[Key] = set()  # frames whose payload a stream is reading now
        self.peer_id = p2p.peer_id.to_base58()
        self.traffic = Traffic()  # every data-plane protocol of this worker adds to it
        self._streams = OpenStreams("frame streams over the caps")
        self._plan_peers: frozenset[str] = frozenset()  # whose frames we read at all
        self._routes: dict[str, list[Multiaddr]] = {}  # peers behind NATs: see keep_routes
        self._keeping_routes = False

    @property
    def num_streams_refused(self) -> int:
        return self._streams.num_refused

    @property
    def p2p(self) -> P2P:
        """The p2pd client, for other stream protocols of this worker (worker/resume/state_transfer.py)."""
        return self._p2p

    @classmethod
    def start(cls, open_p2p: Callable[[], Coroutine[Any, Any, P2P]], expect: ExpectFn) -> Transport:
        """Start the asyncio thread, open the P2P client there and register the frame handler."""
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="p2p-loop", daemon=True).start()
        p2p = asyncio.run_coroutine_threadsafe(open_p2p(), loop).result(timeout=60)
        transport = cls(loop, p2p, expect)
        transport.call(p2p.add_binary_stream_handler(frames.PROTOCOL, transport._handle_stream))
        return transport

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        """Run a coroutine on the transport's loop and wait for its result."""
        return self.submit(coroutine).result(timeout=timeout_s)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run a coroutine on the transport's loop; cancelling the future cancels it there."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def connect_all(
        self,
        peers: Mapping[str, Sequence[str]],
        windows_s: Mapping[str, float] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> list[str]:
        """Tell p2pd where the plan's peers listen and dial them, all at once; the peers that
        could not be reached within their window (`windows_s`, default CONNECT_WINDOW_S: their
        address stays known to p2pd, and a peer that dials us connects us too, so the session
        goes on; a frame that cannot be delivered is what declares a peer lost). Every peer,
        its dials cancelled, as soon as should_stop() holds (a newer plan, a stop): a long
        window held up the session that would take the next plan."""

        self._plan_peers = frozenset(peers)
        windows = {p: (windows_s or {}).get(p, CONNECT_WINDOW_S) for p in peers}
        if peers:
            longest_s = max(windows.values())
            log.info("connecting to the plan's %d peers (up to %.0f s)", len(peers), longest_s)

        async def dial_all() -> list[bool]:
            return list(
                await asyncio.gather(*(self._connect(p, a, windows[p]) for p, a in peers.items()))
            )

        dialling = self.submit(dial_all())
        give_up = self._loop.time() + max(windows.values(), default=CONNECT_WINDOW_S) + 30.0
        while not wait_futures([dialling], timeout=DIAL_POLL_S).done:
            if should_stop() or self._loop.time() > give_up:
                dialling.cancel()  # cancels the dials on the loop
                log.info("stopped dialling the plan's peers")
                return list(peers)
        results = dialling.result()
        return [peer for peer, ok in zip(peers, results, strict=True) if not ok]

    async def _connect(self, peer_id: str, maddrs: Sequence[str], window_s: float) -> bool:
        addrs = transport_addrs(maddrs)
        if not addrs:
            log.warning("no address of %s to dial: %s", peer_id, list(maddrs)[:4])
            return False
        deadline = self._loop.time() + window_s
        problem = ""
        # Two peers of a new plan dial each other at once; over long round trips both Noise
        # handshakes can fail ("message is too short"), and p2pd then refuses new dials for a
        # while ("dial backoff", 5 s and growing). So the smaller peer id dials first; the other
        # waits a little (its connect then finds the connection up), and random pauses break
        # any tie left. We keep trying past the backoff.
        if self.peer_id > peer_id:
            await self._wait_dialled_by(peer_id, random.uniform(*YIELD_DIAL_S))
        while self._loop.time() < deadline:
            try:
                await self._p2p._client.connect(PeerID.from_base58(peer_id), addrs)
                return True
            except Exception as exc:  # p2pd reports failures as ControlFailure and others
                problem = repr(exc)[-200:]
            await asyncio.sleep(random.uniform(0.5, 2.0))
        log.warning("could not connect to %s in %.0f s: %s", peer_id, window_s, problem)
        return False

    def keep_routes(self, routes: Mapping[str, Sequence[str]]) -> None:
        """Keep a connection up to each peer reached through a local route (a hole punch or a
        relay: control/traversal.py). p2pd forgets the route once identify hands it the peer's
        own signed addresses (which no one can dial: it is behind a NAT), so a route whose
        connection dropped (a relay that died) is re-dialled from here, every ROUTE_CHECK_S."""
        parsed = {peer: transport_addrs(addrs) for peer, addrs in routes.items()}
        dialled = {peer: addrs for peer, addrs in parsed.items() if addrs}
        self._loop.call_soon_threadsafe(self._set_routes, dialled)

    def _set_routes(self, routes: dict[str, list[Multiaddr]]) -> None:
        self._routes = routes
        if routes and not self._keeping_routes:
            self._keeping_routes = True
            self._loop.create_task(self._keep_routes())

    async def _keep_routes(self) -> None:
        while True:
            await asyncio.sleep(ROUTE_CHECK_S)
            with contextlib.suppress(Exception):
                connected = {info.peer_id for info in await self._p2p.list_peers()}
                for peer, addrs in list(self._routes.items()):
                    peer_id = PeerID.from_base58(peer)
                    if peer_id not in connected:
                        with contextlib.suppress(Exception):
                            await self._p2p._client.connect(peer_id, addrs)

    async def _wait_dialled_by(self, peer_id: str, timeout_s: float) -> None:
        """Return once the peer connected to us, or after timeout_s."""
        deadline = self._loop.time() + timeout_s
        wanted = PeerID.from_base58(peer_id)
        while self._loop.time() < deadline:
            with contextlib.suppress(Exception):
                if any(info.peer_id == wanted for info in await self._p2p.list_peers()):
                    return
            await asyncio.sleep(0.1)

    def send(
        self,
        peer_id: str,
        tensor: torch.Tensor,
        kind: str,
        run_id: str,
        plan: PlanKey,
        step: int,
        micro: int,
        timeout_s: float = SEND_TIMEOUT_S,
        wire: str | None = None,
    ) -> Future[None]:
        """Send a frame of plan (term, epoch) as wire type `wire` (frames.WIRE_DTYPES; by
        default the tensor's dtype) without blocking; the future fails with PeerLost if it is
        not accepted within timeout_s. The tensor is encoded here, in the caller's thread."""
        header = frames.header_for(tensor, kind, run_id, plan, step, micro, self.peer_id, wire)
        payload = frames.encode_payload(tensor, header.dtype, header.scale_exp)
        coroutine = self._send(peer_id, header, payload, timeout_s)
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _send(
        self, peer_id: str, header: FrameHeader, tensor: torch.Tensor, timeout_s: float
    ) -> None:
        # Frames are idempotent (the receiver accepts a duplicate and keeps the first), so any
        # transient failure, or a BUSY neighbour that has no plan yet, is simply retried.
        deadline = self._loop.time() + timeout_s
        problem = ""
        failures = 0
        while self._loop.time() < deadline:
            try:
                async with asyncio.timeout(max(0.1, deadline - self._loop.time())):
                    answer = await self._send_once(peer_id, header, tensor)
            except TimeoutError:
                problem = "timed out"
                break
            except Exception as exc:  # p2pd reports failures as several exception types
                problem, failures = repr(exc), failures + 1
                # the first failure said, the rest counted: a neighbour gone fails every
                # BUSY_RETRY_S until the deadline (583 lines in a minute on one console)
                log.log(
                    logging.INFO if failures == 1 else logging.DEBUG,
                    "retrying %s %d/%d to %s until %.0f s have passed: %s",
                    header.kind,
                    header.step,
                    header.micro,
                    peer_id,
                    timeout_s,
                    problem,
                )
            else:
                if answer == frames.ACCEPTED:
                    return
                if answer != frames.BUSY:
                    raise PeerLost(f"{peer_id} refused {header.kind} {header.step}/{header.micro}")
                problem = "the neighbour stayed busy"
            await asyncio.sleep(BUSY_RETRY_S)
        tries = f" ({failures} failed tries)" if failures > 1 else ""
        raise PeerLost(
            f"sending {header.kind} {header.step}/{header.micro} to {peer_id}: {problem}{tries}"
        )

    async def open_stream(
        self, peer_id: str, protocol: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new stream of `protocol` to `peer_id` (on the transport's loop)."""
        _, reader, writer = await self._p2p.call_binary_stream_handler(
            PeerID.from_base58(peer_id), protocol
        )
        return reader, writer

    async def _send_once(self, peer_id: str, header: FrameHeader, tensor: torch.Tensor) -> bytes:
        reader, writer = await self.open_stream(peer_id, frames.PROTOCOL)
        writing = asyncio.ensure_future(self._write_frame(peer_id, writer, header, tensor))
        try:
            return await reader.readexactly(1)
        finally:
            writing.cancel()  # finished already, unless the receiver answered before the payload
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await writing
            # a payload the receiver did not take is dropped with its stream: closed, it stayed
            # buffered (a copy per retry) while a neighbour that answers and never reads lived
            end_stream(writer, flushed=completed(writing))

    async def _write_frame(
        self,
        peer_id: str,
        writer: asyncio.StreamWriter,
        header: FrameHeader,
        tensor: torch.Tensor,
    ) -> None:
        encoded = header.encode()
        writer.write(encoded)
        writer.write(frames.tensor_bytes(tensor))
        await writer.drain()
        # every copy counts, retries too: each one crossed the link
        self.traffic.sent(peer_id, len(encoded) + header.num_bytes)

    async def _handle_stream(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = info.peer_id.to_base58()
        if remote not in self._plan_peers:
            # not (yet) a peer of our plan: a neighbour of a newer plan retries on BUSY until
            # we have that plan too; anyone else gets nothing read
            writer.write(frames.BUSY)
            writer.close()
            return
        if self._streams.of(remote) >= MAX_INBOUND_PER_PEER:
            self._streams.refused(remote)
            writer.write(frames.REJECTED)
            writer.close()
            return
        with self._streams.serving(remote):
            await FRAMING.answer(remote, reader, writer, self._read_frame(remote, reader))

    async def _read_frame(self, remote: str, reader: asyncio.StreamReader) -> bytes:
        """Read, check and file one frame; the answer to send back."""
        raw = await FRAMING.read_header(reader, HEADER_TIMEOUT_S)
        self.traffic.received(remote, frames.HEADER_LEN.size + len(raw))
        header = FrameHeader.decode(raw)
        try:
            expected = self._expect(header)
        except frames.NotReady:
            return frames.BUSY  # before reading the payload: the sender retries
        except frames.AlreadyHave:
            return frames.ACCEPTED  # idempotent: the first copy was used
        problem = frames.check_header(header, remote, expected)
        if problem is not None or expected is None:
            raise WireError(f"malformed frame: {problem}")  # a BAD_INPUT: answered REJECTED
        # a copy of a frame here already, or being read: nothing more is read (16 copies of
        # one frame on a neighbour's streams each took the frame's size three times over)
        key = FrameInbox.key_of(header)
        if self.inbox.holds(header):
            return frames.ACCEPTED  # a retry whose first copy arrived: the first stays
        if key in self._reading:
            return frames.BUSY  # the sender retries once the first copy is in (or failed)
        self._reading.add(key)
        try:
            # the payload at the slowest rate a hop may have: a slow link's large frame took
            # longer than a fixed minute, and every copy was cut short
            async with asyncio.timeout(max(SEND_TIMEOUT_S, header.num_bytes * 8 / MIN_RATE_BPS)):
                payload = await reader.readexactly(header.num_bytes)
        finally:
            self._reading.discard(key)
        self.traffic.received(remote, len(payload))
        self.inbox.put(header, frames.decode_tensor(header, payload, expected.max_abs))
        return frames.ACCEPTED

    def close(self) -> None:
        try:
            self.call(self._p2p.shutdown(), timeout_s=5)
        except Exception as exc:
            log.debug("p2p shutdown: %r", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
