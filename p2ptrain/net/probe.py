"""Link probes: round-trip time by echo, bandwidth by a bounded timed transfer.

Both protocols are request/response on a fresh stream over the already-open connection, with a
timeout around every read; the server caps everything it is asked to send or receive. Neither
can be answered faster than the bytes travel: an echo returns fresh random bytes, and a
bandwidth acknowledgement carries the hash of the random bytes it acknowledges (issue 26.9).
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Callable

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2ptrain.net.framing import read_exact, read_frame, read_some, send, write_frame
from p2ptrain.net.stream_end import end, ending

# 2: after the echoes the server sends one frame of its own word (`trailer`: the control plane's
# network coordinate, so a node outside telemetry's audience still learns where its neighbours
# are: control/gossip.py); 1: echoes only
PING_PROTOCOL = TProtocol("/p2ptrain/ping/2.0.0")
MAX_TRAILER_BYTES = 512
# 2: the receiver acknowledges half-way and at the end (1: at the end only); 3: each
# acknowledgement carries the SHA-256 of the bytes it acknowledges (2's bare bytes could be sent
# before the bytes arrived: a peer forged a fast link)
BANDWIDTH_PROTOCOL = TProtocol("/p2ptrain/bandwidth/3.0.0")
PING_BYTES = 32
NUM_PINGS = 5
PROBE_TIMEOUT_S = 3.0
OPEN_TIMEOUT_S = 10.0  # opening a probe's stream, a dial included
# a bandwidth probe: opening the stream (a few round trips) and up to 512 KiB at ~1 Mbit/s
BANDWIDTH_TIMEOUT_S = 10.0
MAX_BANDWIDTH_PROBE_BYTES = 4 * 1024 * 1024
# a probe's second half may read at most this much over the whole transfer: long links' second
# halves read 1.7-2x their rate (8 peers over 4 cities), which steered averaging over oceans
MAX_SECOND_HALF_GAIN = 1.25
DEFAULT_BANDWIDTH_PROBE_BYTES = 1024 * 1024
_CHUNK_BYTES = 64 * 1024
_SIZE = struct.Struct(">I")
_HALF, _ALL = b"\x01", b"\x02"  # an acknowledgement: its tag, then a SHA-256 digest
_ACK_BYTES = 1 + hashlib.sha256().digest_size


class ForgedAck(ValueError):
    """A bandwidth acknowledgement that does not prove its bytes arrived: a failed probe."""


async def handle_ping(stream: INetStream, trailer: Callable[[], bytes] | None = None) -> None:
    """Echo NUM_PINGS fixed-size pings, then send `trailer()` as one frame (none: empty)."""
    try:
        with trio.move_on_after(PROBE_TIMEOUT_S * (NUM_PINGS + 1)):
            for _ in range(NUM_PINGS):
                await send(stream, await read_exact(stream, PING_BYTES))
            await write_frame(stream, trailer()[:MAX_TRAILER_BYTES] if trailer else b"")
    except Exception:  # a vanished client is not our problem
        pass
    finally:
        await _close_quietly(stream)


async def measure_rtt_ms(host: IHost, peer: ID) -> float:
    """The fastest of NUM_PINGS echo round trips, in ms (see measure_rtt)."""
    rtt_ms, _ = await measure_rtt(host, peer)
    return rtt_ms


async def measure_rtt(host: IHost, peer: ID) -> tuple[float, bytes]:
    """The fastest of NUM_PINGS echo round trips, in ms (the minimum, not the median: queueing
    and scheduling only ever add to the propagation delay), and the server's trailer (its
    word, unchecked: the caller decodes it). Raises on failure or timeout."""
    # a timeout per round trip, not for all of them: 5 pings and the stream's negotiation on a
    # 446 ms link take over 3 s, and such a link must be measured, not given up on; opening the
    # stream may dial first (TCP, noise, yamux: several round trips on a loaded machine)
    with trio.fail_after(OPEN_TIMEOUT_S):
        stream = await host.new_stream(peer, [PING_PROTOCOL])
    async with ending(stream):  # reset on a failure or timeout: net/stream_end.py
        samples = []
        for _ in range(NUM_PINGS):
            payload = os.urandom(PING_BYTES)
            with trio.fail_after(PROBE_TIMEOUT_S):
                start = time.perf_counter()
                await send(stream, payload)
                if await read_exact(stream, PING_BYTES) != payload:
                    raise ValueError("ping echo mismatch")
                samples.append((time.perf_counter() - start) * 1000)
        with trio.fail_after(PROBE_TIMEOUT_S):
            trailer = await read_frame(stream, MAX_TRAILER_BYTES)
    return min(samples), trailer


async def handle_bandwidth(stream: INetStream) -> None:
    """Receive a size (capped), then that many bytes; when the first half of them (size // 2)
    has arrived, reply _HALF and their SHA-256, and when all have, _ALL and the SHA-256 of
    all of them."""
    try:
        with trio.move_on_after(BANDWIDTH_TIMEOUT_S):
            (size,) = _SIZE.unpack(await read_exact(stream, _SIZE.size))
            if size > MAX_BANDWIDTH_PROBE_BYTES:
                return
            half, received, half_acked = size // 2, 0, False
            first, whole = hashlib.sha256(), hashlib.sha256()
            while received < size:
                # never read across the half-way mark: the first digest covers exactly `half`
                limit = half - received if received < half else size - received
                chunk = await read_some(stream, min(limit, _CHUNK_BYTES))
                if not chunk:
                    return
                received += len(chunk)
                whole.update(chunk)
                if received <= half:
                    first.update(chunk)
                if not half_acked and received >= half:
                    await send(stream, _HALF + first.digest())
                    half_acked = True
            await send(stream, _ALL + whole.digest())
    except Exception:
        pass
    finally:
        await _close_quietly(stream)


async def measure_bandwidth_mbps(
    host: IHost, peer: ID, num_bytes: int = DEFAULT_BANDWIDTH_PROBE_BYTES, rtt_s: float = 0.0
) -> float:
    """Send num_bytes; the receiver acknowledges half-way and at the end: Mbit/s of the second
    half, the time between the two acknowledgements. Both come back the same way, so the round
    trip cancels out, and TCP's slow start (and a stream's first window) is mostly spent in the
    first half: a timed whole transfer read a 7 Mbit/s, 446 ms link at a fraction of its rate.
    The second half can also read too fast: bytes queued on the way arrive in a burst (one
    probe read a 40 Mbit/s link at 276 Mbit/s), so the result is at most 1.25x the rate of the
    whole transfer, first write to last acknowledgement less `rtt_s`, which no queue speeds up.

    The bytes are fresh random ones (never repeating: nothing received predicts the rest), and
    each acknowledgement must carry the SHA-256 of the bytes it acknowledges: the far end cannot
    acknowledge bytes before they arrive. A wrong or early acknowledgement raises ForgedAck (a
    failed probe). A far end can still hold its half-way acknowledgement back; the cap on the
    whole transfer's rate bounds what that gains (its last acknowledgement needs every byte)."""
    num_bytes = max(2, min(num_bytes, MAX_BANDWIDTH_PROBE_BYTES))
    payload = os.urandom(num_bytes)
    half = num_bytes // 2
    expected = (
        _HALF + hashlib.sha256(payload[:half]).digest(),
        _ALL + hashlib.sha256(payload).digest(),
    )
    acks: list[float] = []
    with trio.fail_after(BANDWIDTH_TIMEOUT_S):
        stream = await host.new_stream(peer, [BANDWIDTH_PROTOCOL])
        started = time.perf_counter()
        async with ending(stream):  # reset on a failure or timeout: net/stream_end.py

            async def send_probe() -> None:
                await send(stream, _SIZE.pack(num_bytes))
                for start in range(0, num_bytes, _CHUNK_BYTES):
                    await send(stream, payload[start : start + _CHUNK_BYTES])

            async def read_acks() -> None:
                for ack in expected:
                    if await read_exact(stream, _ACK_BYTES) != ack:
                        raise ForgedAck(f"bandwidth probe of {peer}: acknowledgement mismatch")
                    acks.append(time.perf_counter())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_probe)
                nursery.start_soon(read_acks)
    second_half_bytes = num_bytes - half
    second_half = second_half_bytes * 8 / max(acks[1] - acks[0], 1e-6) / 1e6
    whole = num_bytes * 8 / max(acks[1] - started - rtt_s, 1e-6) / 1e6
    return min(second_half, MAX_SECOND_HALF_GAIN * whole)


async def _close_quietly(stream: INetStream) -> None:
    await end(stream, clean=True)  # a server's end of a probe: shielded and bounded
