"""Tiny request/response over one libp2p stream: one framed request, one framed JSON reply.

Inbound streams are capped (InboundLimits): at most MAX_INBOUND_STREAMS_PER_PEER at once from
one peer and MAX_INBOUND_STREAMS in all, across every protocol guarded by one limiter, of which
peers that are not members of the run share at most a quarter: strangers holding streams open
cannot lock members out; and a peer, and all strangers together, may open only so many a second
(net/ratelimit.py: a loop of requests would have had our loop build its replies as fast as it
could). A stream past a cap or a rate is reset unread; one still open after
STREAM_DEADLINE_S (idle or not) is reset; both, and bad requests, are logged 1 line in 100
(sampled_log.py). A reply larger than MAX_REPLY_BYTES is never cut into invalid JSON:
the client gets `{"error": ...}` instead (paged protocols keep their pages far below it).
A protocol may set a smaller cap for its replies, both ends (cap_replies): a client refuses a
larger reply by its length, before it reads or parses it (a 4 MiB reply of `[[],[],...]` held
the loop 0.38 s).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2ptrain.errors import WireError
from p2ptrain.net.framing import FrameTooLarge, read_frame, write_frame
from p2ptrain.net.ratelimit import StreamRates
from p2ptrain.net.stream_end import end, ending
from p2ptrain.records.fields import json_value
from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 10.0  # generous: a node on a loaded 2-core box can stall for seconds
MAX_REQUEST_BYTES = 4 * 1024
MAX_REPLY_BYTES = 4 * 1024 * 1024

# Each inbound stream costs a trio task and a yamux window; honest peers open a handful at once
# (a sync, a status, a ping, a bandwidth probe), so 8 per peer is slack and 256 in all covers a
# swarm of ~100 peers all probing us at the same moment.
MAX_INBOUND_STREAMS_PER_PEER = 8
MAX_INBOUND_STREAMS = 256
STRANGERS_SHARE = 0.25  # of MAX_INBOUND_STREAMS: what non-members may hold, all of them together
# every guarded exchange ends well within it (RPCs 10 s, dial-back 12 s, relay signalling 10 s,
# probes 10 s): a stream still open then is idle or hostile
STREAM_DEADLINE_S = 20.0

# per protocol: the largest reply its server sends and its client reads (cap_replies)
_REPLY_CAPS: dict[str, int] = {}

Responder = Callable[[bytes], Awaitable[dict[str, Any]]]
Handler = Callable[[INetStream], Awaitable[None]]


class InboundLimits:
    """Caps on the inbound streams being handled at once: per remote peer, in all, and for the
    peers that are not members of the run (`is_member`; None: no such share) a smaller share of
    the total, so that members always find room."""

    def __init__(
        self,
        per_peer: int = MAX_INBOUND_STREAMS_PER_PEER,
        total: int = MAX_INBOUND_STREAMS,
        is_member: Callable[[str], bool] | None = None,
        strangers_total: int | None = None,
        deadline_s: float = STREAM_DEADLINE_S,
        rates: StreamRates | None = None,
    ) -> None:
        self.per_peer = per_peer
        self.total = total
        self.is_member = is_member
        self.strangers_total = (
            max(1, int(total * STRANGERS_SHARE)) if strangers_total is None else strangers_total
        )
        self.deadline_s = deadline_s
        self.rates = StreamRates() if rates is None else rates
        self._open: Counter[str] = Counter()
        self._num_open = 0
        self._num_strangers_open = 0
        self.num_refused = 0
        self._log = SampledLog(log)  # a peer opening streams in a loop is no log flood

    def _refusal(self, peer: str, stranger: bool) -> str | None:
        if self._open[peer] >= self.per_peer:
            return "too many open from it"
        if self._num_open >= self.total:
            return "too many open"
        if stranger and self._num_strangers_open >= self.strangers_total:
            return "too many open from non-members"
        if not self.rates.allows(peer, stranger):
            return "opened too fast"
        return None

    def guard(self, handler: Handler) -> Handler:
        """`handler`, run only while the caps allow (a stream past them is reset unread) and
        for at most deadline_s (then the stream is reset)."""

        async def guarded(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id.to_base58()
            stranger = self.is_member is not None and not self.is_member(peer)
            if (why := self._refusal(peer, stranger)) is not None:
                self.num_refused += 1
                self._log.event(
                    "refused", "refused a %s stream from %s: %s", stream.get_protocol(), peer, why
                )
                with contextlib.suppress(Exception):
                    await stream.reset()
                return
            self._open[peer] += 1
            self._num_open += 1
            self._num_strangers_open += stranger
            try:
                with trio.move_on_after(self.deadline_s) as deadline:
                    await handler(stream)
                if deadline.cancelled_caught:
                    self._log.event(
                        "overdue",
                        "reset a %s stream from %s: open past %.0f s",
                        stream.get_protocol(),
                        peer,
                        self.deadline_s,
                    )
                    with contextlib.suppress(Exception):
                        await stream.reset()
            finally:
                self._open[peer] -= 1
                self._num_open -= 1
                self._num_strangers_open -= stranger
                if not self._open[peer]:
                    del self._open[peer]

        return guarded


def cap_replies(protocol: TProtocol, max_bytes: int) -> None:
    """Cap `protocol`'s replies at max_bytes (at most MAX_REPLY_BYTES), both ends: a larger
    reply of ours becomes an error, a larger one sent to us is refused unread."""
    _REPLY_CAPS[str(protocol)] = min(max_bytes, MAX_REPLY_BYTES)


def reply_cap(protocol: str) -> int:
    """The largest reply of `protocol`: its cap_replies, or MAX_REPLY_BYTES."""
    return _REPLY_CAPS.get(str(protocol), MAX_REPLY_BYTES)


def make_handler(respond: Responder) -> Handler:
    """A stream handler that reads one request (<= 4 KiB), answers with respond()'s JSON."""
    bad_requests = SampledLog(log)  # any peer can send garbage in a loop

    async def handle(stream: INetStream) -> None:
        try:
            with trio.move_on_after(RPC_TIMEOUT_S):
                request = await read_frame(stream, MAX_REQUEST_BYTES)
                reply = json.dumps(await respond(request), separators=(",", ":")).encode()
                if len(reply) > reply_cap(str(stream.get_protocol())):  # never cut the JSON
                    log.warning(
                        "a %s reply of %d bytes is too large", stream.get_protocol(), len(reply)
                    )
                    reply = json.dumps({"error": "reply too large"}).encode()
                await write_frame(stream, reply)
        except Exception as exc:
            bad_requests.event("bad", "dropped a bad %s request: %s", stream.get_protocol(), exc)
        finally:
            await end(stream, clean=True)  # bounded, whatever cancelled us

    return handle


async def call(host: IHost, peer: ID, protocol: TProtocol, request: bytes = b"") -> Any:
    """Send one request and return the decoded JSON reply; raises on timeout, WireError on a
    reply that is not JSON or is over the protocol's cap (reply_cap: refused unread)."""
    with trio.fail_after(RPC_TIMEOUT_S):
        stream = await host.new_stream(peer, [protocol])
        async with ending(stream):  # reset on a timeout: net/stream_end.py
            await write_frame(stream, request)
            try:
                reply = await read_frame(stream, reply_cap(protocol))
            except FrameTooLarge as exc:  # a cut stream is a FrameError, and nobody's fault
                raise WireError(f"oversized: RPC reply: {exc}") from None
            return json_value(reply, "RPC reply")
