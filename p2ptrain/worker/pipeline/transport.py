"""Pipeline transport: tensor frames to and from neighbours over hivemind's p2pd streams.

hivemind's P2P client is asyncio; the trainer is plain blocking code. So the transport owns an
asyncio loop in a background thread: its intake (worker/pipeline/frame_intake.py) validates
incoming frames and files them in an inbox keyed by plan (term, epoch), kind, step and
micro-batch (worker/pipeline/frame_inbox.py); the trainer sends with `send()` (returns a future)
and blocks in `inbox.take()` until the frame it needs arrives, the peer is declared lost, or it
stops. A neighbour's frames go one after another on streams kept open (pipe.v4,
worker/kept_streams.py); one of the last version gets a stream a frame (pipe.v3). The plan's
peers are dialled by worker/pipeline/dialing.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

import torch
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from p2ptrain.worker.inbound import completed, end_stream
from p2ptrain.worker.kept_streams import IdleStreams, Stream
from p2ptrain.worker.pipeline import dialing, frames
from p2ptrain.worker.pipeline.dialing import transport_addrs
from p2ptrain.worker.pipeline.frame_inbox import PlanKey
from p2ptrain.worker.pipeline.frame_intake import ExpectFn, FrameIntake
from p2ptrain.worker.pipeline.frames import FrameHeader, PeerLost
from p2ptrain.worker.pipeline.link_bounds import (
    CONNECT_WINDOW_S,
    SEND_TIMEOUT_S,
)
from p2ptrain.worker.traffic import Traffic

log = logging.getLogger(__name__)

T = TypeVar("T")
BUSY_RETRY_S = 0.2
DIAL_POLL_S = 0.2  # how often connect_all asks whether to stop dialling
# idle frame streams kept a neighbour: frames to it go a micro-batch each at once, and a
# handful of micro-batches is the usual (more are opened when needed, and closed when answered)
MAX_IDLE_FRAME_STREAMS = 4

__all__ = ["Transport", "transport_addrs"]


class Transport:
    """Frames in and out of one worker; `expect` says what is acceptable right now."""

    def __init__(self, loop: asyncio.AbstractEventLoop, p2p: P2P, expect: ExpectFn) -> None:
        self._loop = loop
        self._p2p = p2p
        self.peer_id = p2p.peer_id.to_base58()
        self.traffic = Traffic()  # every data-plane protocol of this worker adds to it
        self.intake = FrameIntake(expect, self.traffic)  # frames in: checked, read, filed
        self.inbox = self.intake.inbox  # what was accepted: the trainer takes from it
        self._routes: dict[str, list[Multiaddr]] = {}  # peers behind NATs: see keep_routes
        self._keeping_routes = False
        self._idle = IdleStreams(MAX_IDLE_FRAME_STREAMS)  # on the loop only
        self._one_shot: set[str] = set()  # neighbours that speak pipe.v3 only

    @property
    def num_streams_refused(self) -> int:
        return self.intake.num_refused

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
        intake = transport.intake
        transport.call(p2p.add_binary_stream_handler(frames.PROTOCOL, intake.handle_stream))
        transport.call(
            p2p.add_binary_stream_handler(frames.STREAM_PROTOCOL, intake.handle_kept_stream)
        )
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

        self.intake.plan_peers = frozenset(peers)
        windows = {p: (windows_s or {}).get(p, CONNECT_WINDOW_S) for p in peers}
        if peers:
            longest_s = max(windows.values())
            log.info("connecting to the plan's %d peers (up to %.0f s)", len(peers), longest_s)

        async def dial_all() -> list[bool]:
            return list(
                await asyncio.gather(
                    *(
                        dialing.connect(self._p2p, self.peer_id, p, a, windows[p])
                        for p, a in peers.items()
                    )
                )
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
            self._loop.create_task(dialing.keep_routes(self._p2p, lambda: self._routes))

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
        """One try: on a stream the last frame to `peer_id` left idle (one closed meanwhile
        costs a fresh one, not a retry's pause), else on a new one; the answer."""
        idle = self._idle.take(peer_id)
        if idle is not None:
            with contextlib.suppress(Exception):  # p2pd raises several kinds
                return await self._send_on(peer_id, idle, header, tensor, keep=True)
        if peer_id in self._one_shot:
            stream = await self.open_stream(peer_id, frames.PROTOCOL)
            return await self._send_on(peer_id, stream, header, tensor)
        try:
            stream = await self.open_stream(peer_id, frames.STREAM_PROTOCOL)
        except Exception:  # unreachable, or a neighbour of the last version
            stream = await self.open_stream(peer_id, frames.PROTOCOL)
            self._one_shot.add(peer_id)  # it answered on v3: it does not speak v4
            return await self._send_on(peer_id, stream, header, tensor)
        return await self._send_on(peer_id, stream, header, tensor, keep=True)

    async def _send_on(
        self,
        peer_id: str,
        stream: Stream,
        header: FrameHeader,
        tensor: torch.Tensor,
        keep: bool = False,
    ) -> bytes:
        """Write one frame on `stream` and read its answer. A kept stream (`keep`, pipe.v4)
        whose frame was answered ACCEPTED was read whole and carries the next frame; any other
        stream ends here."""
        reader, writer = stream
        writing = asyncio.ensure_future(self._write_frame(peer_id, writer, header, tensor))
        kept = False
        try:
            answer = await reader.readexactly(1)
            if keep and answer == frames.ACCEPTED:
                await writing  # the receiver read it all: the write is done or about to be
                self._idle.put(peer_id, stream)
                kept = True
            return answer
        finally:
            if not kept:
                writing.cancel()  # finished already, unless answered before the payload
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await writing
                # a payload the receiver did not take is dropped with its stream: closed, it
                # stayed buffered (a copy per retry) while a neighbour that answers and never
                # reads lived
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

    def close(self) -> None:
        async def close_idle() -> None:
            self._idle.close_all()

        with contextlib.suppress(Exception):
            self.call(close_idle(), timeout_s=5)
        try:
            self.call(self._p2p.shutdown(), timeout_s=5)
        except Exception as exc:
            log.debug("p2p shutdown: %r", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
