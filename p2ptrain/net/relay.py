"""Relays and hole punches for peers behind NATs, in both planes (records/relay.py says the wire).

A public peer runs a RelayServer: a control-plane protocol (RELAY_PROTOCOL) through which NATed
members reserve a slot and others ask to reach them, and a raw TCP port (the relay port) that
answers "which endpoint do you see" and splices the two halves of a relayed circuit. A relayed or
punched connection carries a whole libp2p connection (py-libp2p's or the worker's p2pd's) whose
own Noise handshake authenticates both ends; the relay forwards ciphertext.

Hole punching is TCP simultaneous open: each side learns the public endpoint of one local port
from the relay port (RAW_OBSERVE), the relay swaps the endpoints over the control plane, and both
connect from that port to the other's endpoint at once. Behind endpoint-independent ("cone")
NATs the crossing SYNs open both mappings; a symmetric NAT maps the punch to another port, the
connect times out and the caller relays instead.

Why not libp2p's circuit relay v2 and DCUtR: the worker's p2pd (hivemind's) has no hole punching,
and it reserves relay slots only after autorelay's boot delay, minutes (docs/benchmarks.md,
"NAT"). Carrying both planes' TCP connections below libp2p gives both the same relays and
punches, at once, with no change to either library.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from p2ptrain.errors import WireError
from p2ptrain.records.relay import (
    RAW_CIRCUIT,
    RAW_HELLO_BYTES,
    RAW_OBSERVE,
    TOKEN_BYTES,
    RawHello,
    split_endpoint,
)
from p2ptrain.records.relay import endpoint as valid_endpoint

log = logging.getLogger(__name__)

RAW_HELLO_TIMEOUT_S = 5.0  # a raw connection's first bytes
CIRCUIT_PAIRING_S = 15.0  # both halves of a circuit arrive within this of its grant
MAX_RESERVATIONS = 64
# relayed connections at once, over all reservations; per peer: a NATed peer has one per plane
# and NATed partner, two when both ends dialled at once, and a few mid-handshake or closing
MAX_CIRCUITS = 192
MAX_CIRCUITS_PER_PEER = 48
MAX_CIRCUIT_BYTES = 4 * 1024**3  # each way; then the circuit is reset
MAX_PENDING = 128
RESERVATION_TTL_S = 120.0
PUNCH_TIMEOUT_S = 4.0  # covers one SYN retransmit (1 s) and a 446 ms round trip, with room
_CHUNK = 64 * 1024
_REUSE = tuple(
    option
    for option in (getattr(socket, "SO_REUSEADDR", None), getattr(socket, "SO_REUSEPORT", None))
    if option is not None
)


@dataclass
class RelayCounters:
    """What a relay moved: bytes each way over all circuits, circuits opened and refused."""

    bytes_relayed: int = 0
    circuits: int = 0
    refused: int = 0
    active: int = 0


@dataclass
class _Pending:
    source: str
    target: str
    created: float
    halves: list[trio.SocketStream] = field(default_factory=list)
    paired: trio.Event = field(default_factory=trio.Event)


class RelayServer:
    """The relay side: reservations, circuit grants and the raw port's splicing, with limits."""

    def __init__(
        self, may_use: Callable[[str], bool], counters: RelayCounters | None = None
    ) -> None:
        self.may_use = may_use  # an admitted member of the run (the organiser's token)
        self.reservations: dict[str, float] = {}  # peer -> expiry (monotonic)
        self.pending: dict[bytes, _Pending] = {}
        self.per_peer: dict[str, int] = {}
        self.counters = counters if counters is not None else RelayCounters()

    def reserve(self, peer: str, now: float) -> str:
        """'' if `peer` holds a slot until now + RESERVATION_TTL_S, else why not."""
        self._expire(now)
        if not self.may_use(peer):
            return "not a member of this run"
        if peer not in self.reservations and len(self.reservations) >= MAX_RESERVATIONS:
            return self._refuse(f"relay full ({MAX_RESERVATIONS} reservations)")
        self.reservations[peer] = now + RESERVATION_TTL_S
        return ""

    def grant(self, source: str, target: str, now: float) -> tuple[str, bytes]:
        """('', token) for a circuit from source to a reserved target, else (why not, b'')."""
        self._expire(now)
        if not self.may_use(source):
            return "not a member of this run", b""
        if target not in self.reservations:
            return "no reservation here", b""
        busy = self.counters.active + len(self.pending)
        if busy >= MAX_CIRCUITS or len(self.pending) >= MAX_PENDING:
            return self._refuse(f"relay busy ({MAX_CIRCUITS} circuits)"), b""
        if max(self._circuits_of(source), self._circuits_of(target)) >= MAX_CIRCUITS_PER_PEER:
            return self._refuse(f"at most {MAX_CIRCUITS_PER_PEER} circuits per peer"), b""
        token = secrets.token_bytes(TOKEN_BYTES)
        self.pending[token] = _Pending(source, target, now)
        return "", token

    def _refuse(self, why: str) -> str:
        """Count a refusal for capacity and say so (the 1st, then every 100th): a relay at its
        limits is not oversubscribed silently."""
        self.counters.refused += 1
        if self.counters.refused % 100 == 1:
            log.warning("relay refused a request (%d so far): %s", self.counters.refused, why)
        return why

    def _circuits_of(self, peer: str) -> int:
        """Circuits a peer is an end of: spliced, or granted and not yet paired."""
        waiting = sum(1 for p in self.pending.values() if peer in (p.source, p.target))
        return self.per_peer.get(peer, 0) + waiting

    def _expire(self, now: float) -> None:
        for peer in [p for p, expiry in self.reservations.items() if expiry < now]:
            del self.reservations[peer]
        for token in [t for t, p in self.pending.items() if now - p.created > CIRCUIT_PAIRING_S]:
            del self.pending[token]

    async def serve_raw(
        self, listener: trio.SocketListener, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept raw connections for as long as the node runs."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._raw_connection, stream)

    async def _raw_connection(self, stream: trio.SocketStream) -> None:
        keep = False
        try:
            with trio.fail_after(RAW_HELLO_TIMEOUT_S):
                hello = RawHello.decode(await receive_exact(stream, RAW_HELLO_BYTES))
            if hello.kind == RAW_OBSERVE:
                ip, port = stream.socket.getpeername()[:2]
                await stream.send_all(encode_observed(f"{ip}:{port}"))
            elif hello.kind == RAW_CIRCUIT:
                keep = True
                await self._join_circuit(hello.token, stream)
        except (WireError, trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.debug("raw relay connection dropped: %s", exc)
        finally:
            if not keep:
                with contextlib.suppress(Exception):
                    await stream.aclose()

    async def _join_circuit(self, token: bytes, stream: trio.SocketStream) -> None:
        pending = self.pending.get(token)
        if pending is None:
            await stream.aclose()
            return
        pending.halves.append(stream)
        if len(pending.halves) == 1:
            with trio.move_on_after(CIRCUIT_PAIRING_S):
                await pending.paired.wait()
            if not pending.paired.is_set():
                self.pending.pop(token, None)
                await stream.aclose()
            return
        del self.pending[token]
        pending.paired.set()
        self.counters.circuits += 1
        self.counters.active += 1
        for peer in (pending.source, pending.target):
            self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        try:
            await splice(pending.halves[0], pending.halves[1], self.counters, MAX_CIRCUIT_BYTES)
        finally:
            self.counters.active -= 1
            for peer in (pending.source, pending.target):
                self.per_peer[peer] -= 1


def encode_observed(text: str) -> bytes:
    data = text.encode()
    return bytes([len(data)]) + data


async def receive_exact(stream: trio.abc.ReceiveStream, num_bytes: int) -> bytes:
    data = b""
    while len(data) < num_bytes:
        chunk = await stream.receive_some(num_bytes - len(data))
        if not chunk:
            raise WireError(f"connection closed after {len(data)} of {num_bytes} bytes")
        data += chunk
    return data


async def splice(
    a: trio.SocketStream,
    b: trio.SocketStream,
    counters: RelayCounters | None = None,
    max_bytes: int = MAX_CIRCUIT_BYTES,
) -> None:
    """Copy both ways until either side ends (or max_bytes one way); then close both."""

    async def copy(source: trio.SocketStream, sink: trio.SocketStream) -> None:
        moved = 0
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while moved < max_bytes:
                chunk = await source.receive_some(_CHUNK)
                if not chunk:
                    break
                await sink.send_all(chunk)
                moved += len(chunk)
                if counters is not None:
                    counters.bytes_relayed += len(chunk)
        nursery.cancel_scope.cancel()  # one side ended: the libp2p connection is over

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(copy, a, b)
            nursery.start_soon(copy, b, a)
    finally:
        for stream in (a, b):
            with contextlib.suppress(Exception):
                await stream.aclose()


async def bound_socket(local_port: int = 0) -> trio.socket.SocketType:
    """A TCP socket on local_port that others may share (a punch reuses an observed port)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for option in _REUSE:
        sock.setsockopt(socket.SOL_SOCKET, option, 1)
    await sock.bind(("0.0.0.0", local_port))
    return sock


async def observe(relay: tuple[str, int], local_port: int = 0) -> tuple[str, int]:
    """(the public endpoint the relay sees for local_port, that port): the first half of a
    punch. Raises OSError, WireError or trio.TooSlowError."""
    sock = await bound_socket(local_port)
    port = int(sock.getsockname()[1])
    with trio.fail_after(RAW_HELLO_TIMEOUT_S):
        await sock.connect(relay)
        stream = trio.SocketStream(sock)
        try:
            await stream.send_all(RawHello(RAW_OBSERVE, bytes(TOKEN_BYTES)).encode())
            (length,) = await receive_exact(stream, 1)
            text = (await receive_exact(stream, length)).decode("ascii", "replace")
        finally:
            await stream.aclose()
    return valid_endpoint(text, "observed endpoint", "endpoint"), port


async def punch(
    local_port: int, other: str, timeout_s: float = PUNCH_TIMEOUT_S
) -> trio.SocketStream:
    """Connect from local_port to the other's endpoint while it connects to ours (TCP
    simultaneous open). Raises trio.TooSlowError or OSError when the NATs do not let it through."""
    deadline = trio.current_time() + timeout_s
    last: OSError | None = None
    while trio.current_time() < deadline:
        sock = await bound_socket(local_port)
        try:
            with trio.move_on_at(deadline):
                await sock.connect(split_endpoint(other))
                return trio.SocketStream(sock)
        except OSError as exc:  # refused before the other's NAT opened: try again
            last = exc
            sock.close()
            await trio.sleep(0.05)
            continue
        sock.close()
    raise last if last is not None else trio.TooSlowError(f"no punch through to {other}")


async def open_raw(relay: tuple[str, int], kind: int, token: bytes) -> trio.SocketStream:
    """A raw connection to a relay port (or a punched peer) that starts with its hello."""
    with trio.fail_after(RAW_HELLO_TIMEOUT_S):
        stream = await trio.open_tcp_stream(*relay)
    await stream.send_all(RawHello(kind, token).encode())
    return stream
