"""The client side of a relay port and of hole punches: observe, punch, open a raw connection.

traversal/relay.py says how relays and punches work; this module is what a peer behind a NAT runs.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from dataclasses import dataclass

import trio

from p2ptrain.errors import WireError
from p2ptrain.records.relay import (
    RAW_OBSERVE,
    TOKEN_BYTES,
    RawHello,
    split_endpoint,
)
from p2ptrain.records.relay import endpoint as valid_endpoint

RAW_HELLO_TIMEOUT_S = 5.0  # a client's connect and first exchange with a relay port
PUNCH_TIMEOUT_S = 4.0  # covers one SYN retransmit (1 s) and a 446 ms round trip, with room
_REUSE = tuple(
    option
    for option in (getattr(socket, "SO_REUSEADDR", None), getattr(socket, "SO_REUSEPORT", None))
    if option is not None
)
# a punch retries only while our own port is busy; any answer of the other end (a refusal, an
# unreachable host) ends it: each retry would be another SYN at whoever holds that endpoint
_LOCAL_RETRY_ERRNOS = frozenset(
    code
    for code in (getattr(errno, n, None) for n in ("EADDRINUSE", "EADDRNOTAVAIL", "EAGAIN"))
    if code is not None
)


async def receive_exact(stream: trio.abc.ReceiveStream, num_bytes: int) -> bytes:
    data = b""
    while len(data) < num_bytes:
        chunk = await stream.receive_some(num_bytes - len(data))
        if not chunk:
            raise WireError(f"connection closed after {len(data)} of {num_bytes} bytes")
        data += chunk
    return data


async def bound_socket(local_port: int = 0) -> trio.socket.SocketType:
    """A TCP socket on local_port that others may share (a punch reuses an observed port)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for option in _REUSE:
        sock.setsockopt(socket.SOL_SOCKET, option, 1)
    await sock.bind(("0.0.0.0", local_port))
    return sock


@dataclass(frozen=True)
class Observation:
    """What one observe told us: the public endpoint the relay saw, the local port it maps,
    and our own address on the interface toward the relay (address_classes.may_dial: what we may dial)."""

    endpoint: str
    port: int
    local_ip: str


async def observe(relay: tuple[str, int], local_port: int = 0) -> tuple[str, int]:
    """(the public endpoint the relay sees for local_port, that port): the first half of a
    punch. Raises OSError, WireError or trio.TooSlowError."""
    seen = await observe_from(relay, local_port)
    return seen.endpoint, seen.port


async def observe_from(relay: tuple[str, int], local_port: int = 0) -> Observation:
    """`observe`, with our own address toward the relay."""
    sock = await bound_socket(local_port)
    port = int(sock.getsockname()[1])
    with trio.fail_after(RAW_HELLO_TIMEOUT_S):
        try:
            await sock.connect(relay)
        except BaseException:
            sock.close()
            raise
        local_ip = str(sock.getsockname()[0])
        stream = trio.SocketStream(sock)
        try:
            await stream.send_all(RawHello(RAW_OBSERVE, bytes(TOKEN_BYTES)).encode())
            (length,) = await receive_exact(stream, 1)
            text = (await receive_exact(stream, length)).decode("ascii", "replace")
        finally:
            await stream.aclose()
    return Observation(valid_endpoint(text, "observed endpoint", "endpoint"), port, local_ip)


async def punch(
    local_port: int, other: str, timeout_s: float = PUNCH_TIMEOUT_S
) -> trio.SocketStream:
    """Connect from local_port to the other's endpoint while it connects to ours (TCP
    simultaneous open). Raises trio.TooSlowError or OSError when the NATs do not let it
    through. A NAT that has not opened yet drops our SYN and the kernel sends it again (about 3
    in all); a refusal or an unreachable host ends the punch at once."""
    deadline = trio.current_time() + timeout_s
    while trio.current_time() < deadline:
        sock = await bound_socket(local_port)
        try:
            with trio.move_on_at(deadline):
                await sock.connect(split_endpoint(other))
                return trio.SocketStream(sock)
        except OSError as exc:
            sock.close()
            if exc.errno not in _LOCAL_RETRY_ERRNOS:
                raise
            await trio.sleep(0.05)  # our own port is not free yet (its last socket closing)
            continue
        sock.close()
    raise trio.TooSlowError(f"no punch through to {other}")


async def open_raw(relay: tuple[str, int], kind: int, token: bytes) -> trio.SocketStream:
    """A raw connection to a relay port (or a punched peer) that starts with its hello.
    Raises OSError, trio.TooSlowError or trio.BrokenResourceError (a reset before the hello
    went out); the connection is closed then."""
    with trio.fail_after(RAW_HELLO_TIMEOUT_S):
        stream = await trio.open_tcp_stream(*relay)
        try:
            await stream.send_all(RawHello(kind, token).encode())
        except BaseException:
            with contextlib.suppress(Exception):
                await stream.aclose()
            raise
    return stream
