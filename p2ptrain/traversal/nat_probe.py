"""What kind of NAT are we behind? A tiny UDP "what address do you see" responder on every node,
and the client `p2ptrain doctor` uses to compare what two servers saw.

The responder listens on the port number of the node's control-plane TCP listener (no new port
to open). It answers only a well-formed 32-byte query (records/reachability.py), with an answer
of the same size to the query's source, at most UDP_ANSWERS_PER_IP per source IP and
UDP_ANSWERS_TOTAL in all per window: a spoofed source gets no more bytes than it sent, and few.
Sources that hold a TCP connection to us (a `doctor` is connected to the servers it asks) have a
budget of their own beyond that: a spoofer must name a connected IP to spend it (members' IPs
are in their records), and then spends that IP's share only.

The client sends from ONE socket to two servers: the same public (ip, port) seen by both is an
endpoint-independent mapping ("cone": hole punching can work), different ports a new mapping per
destination ("symmetric": only a relay or port forwarding helps), and our own address seen by
both no NAT at all ("none").
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import trio

from p2ptrain.errors import WireError
from p2ptrain.net.ratelimit import WindowLimiter
from p2ptrain.records.reachability import (
    NONCE_BYTES,
    UDP_DATAGRAM_BYTES,
    parse_udp_answer,
    parse_udp_query,
    udp_answer,
    udp_query,
)

log = logging.getLogger(__name__)

UDP_ANSWERS_PER_IP = 16
UDP_ANSWERS_TOTAL = 512
UDP_WINDOW_S = 10.0
CONNECTED_ANSWERS_TOTAL = 256  # per window, to sources with a TCP connection to us
CONNECTED_REFRESH_S = 1.0  # how old our list of connected IPs may be (read only under a flood)
QUERY_TIMEOUT_S = 1.0  # per attempt: UDP may be lost, so a few attempts
QUERY_ATTEMPTS = 3
Endpoint = tuple[str, int]


def answer_for(
    data: bytes,
    source: Endpoint,
    limiter: WindowLimiter,
    now: float,
    connected: tuple[WindowLimiter, Callable[[str], bool]] | None = None,
) -> bytes | None:
    """The answer to a datagram `data` from `source`, or None: malformed, not IPv4, or past
    the rate limits (checked last, so that garbage does not use up a source's allowance).
    `connected`: the budget of sources with a TCP connection to us, and who they are, asked
    only once `limiter` says no."""
    try:
        nonce = parse_udp_query(data)
    except WireError:
        return None
    ip, port = source
    if ":" in ip:
        return None
    if not limiter.allow(ip, now) and (
        connected is None or not connected[1](ip) or not connected[0].allow(ip, now)
    ):
        return None
    return udp_answer(nonce, ip, port)


def cached(ips: Callable[[], Collection[str]]) -> Callable[[str], bool]:
    """Whether an IP is among `ips()`, read at most once per CONNECTED_REFRESH_S."""
    read_at, known = float("-inf"), frozenset[str]()

    def has(ip: str) -> bool:
        nonlocal read_at, known
        now = time.monotonic()
        if now - read_at >= CONNECTED_REFRESH_S:
            read_at, known = now, frozenset(ips())
        return ip in known

    return has


async def serve_udp_observer(
    host: str,
    port: int,
    connected_ips: Callable[[], Collection[str]] | None = None,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer queries on UDP host:port until cancelled; started() with the port, or with None
    (and return) when it cannot be bound: a node works without it. `connected_ips()`: the
    remote IPs of our TCP connections, whose queries have a budget of their own."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        try:
            await sock.bind((host, port))
        except OSError as exc:
            log.info("no UDP address observer on %s:%d: %s", host, port, exc)
            task_status.started(None)
            return
        task_status.started(sock.getsockname()[1])
        limiter = WindowLimiter(UDP_ANSWERS_PER_IP, UDP_ANSWERS_TOTAL, UDP_WINDOW_S)
        connected = None
        if connected_ips is not None:
            budget = WindowLimiter(UDP_ANSWERS_PER_IP, CONNECTED_ANSWERS_TOTAL, UDP_WINDOW_S)
            connected = (budget, cached(connected_ips))
        while True:
            try:
                # one byte more than a query: a longer datagram arrives cut, and is refused
                data, source = await sock.recvfrom(UDP_DATAGRAM_BYTES + 1)
            except OSError:
                continue
            answer = answer_for(data, source[:2], limiter, time.monotonic(), connected)
            if answer is not None:
                with contextlib.suppress(OSError):
                    await sock.sendto(answer, source)


async def ask_observed(sock: trio.socket.SocketType, server: Endpoint) -> Endpoint | None:
    """What `server` sees as the source of datagrams from `sock`; None if it never answers."""
    for _ in range(QUERY_ATTEMPTS):
        nonce = os.urandom(NONCE_BYTES)
        with contextlib.suppress(OSError):
            await sock.sendto(udp_query(nonce), server)
        with trio.move_on_after(QUERY_TIMEOUT_S):
            while True:
                try:
                    data, source = await sock.recvfrom(UDP_DATAGRAM_BYTES + 1)
                except OSError:
                    continue
                if source[:2] != server:
                    continue
                with contextlib.suppress(WireError):
                    return parse_udp_answer(data, nonce)
    return None


async def observe_from(
    servers: Sequence[Endpoint], bind_host: str = "0.0.0.0"
) -> tuple[int, list[Endpoint | None]]:
    """Bind one UDP socket and ask each server in turn: (our local port, what each saw)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        await sock.bind((bind_host, 0))
        local_port = int(sock.getsockname()[1])
        return local_port, [await ask_observed(sock, server) for server in servers]


def classify_nat(
    local_port: int, local_ips: Sequence[str], observed: Sequence[Endpoint | None]
) -> tuple[str, str]:
    """("none" | "cone" | "symmetric" | "unknown", why) from what servers saw of one socket."""
    seen = [endpoint for endpoint in observed if endpoint is not None]
    if not seen:
        return "unknown", "no server answered over UDP (UDP blocked?)"
    if all(ip in local_ips and port == local_port for ip, port in seen):
        return "none", f"{len(seen)} server(s) saw our own address {seen[0][0]}:{local_port}"
    if len(seen) < 2:
        return "unknown", (
            f"behind a NAT (seen as {seen[0][0]}:{seen[0][1]}); one server answered, so cone "
            "and symmetric cannot be told apart"
        )
    if len(set(seen)) == 1:
        return "cone", f"{len(seen)} servers saw one public endpoint {seen[0][0]}:{seen[0][1]}"
    ports = ", ".join(f"{ip}:{port}" for ip, port in seen)
    return "symmetric", f"a new public endpoint per destination: {ports}"
