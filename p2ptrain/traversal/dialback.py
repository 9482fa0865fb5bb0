"""Dial-back: can others open a connection to us? (AutoNAT-style, DIALBACK_PROTOCOL)

A peer sends a DialBackRequest of its control-plane addresses over its open connection to a
server; the server dials each candidate on a FRESH TCP connection (never the open one: a NATed
peer's own outbound connection would make it look reachable) and runs a Noise handshake that
must authenticate the requester's peer id, then answers a DialBackReply: whether a dial reached
the requester (one bit: the address that reached it, else nothing, never a failure per port),
the requester's address as seen on the request's connection, and its own clock.

The server dials only the requester's own IP as it sees it (the requested addresses on that IP,
and that IP at each requested port), at most MAX_DIALS_PER_REQUEST of them, never a port below
1024. It answers only on a direct connection: relayed and punched connections reach us spliced
from 127.0.0.1 (control/traversal.py), so a request seen from loopback is refused unless all our
own addresses are loopback (a swarm on one machine, as in the tests); otherwise the requester
could make us probe our own machine's loopback ports. What it can still learn is whether some
port of its own IP completes a handshake with its own key. Requests that make us dial are
rate-limited per requester IP (an IPv6 /64), per public /24 (IPv6 /48) and in all, members of the
run (and the organiser) and strangers on budgets of their own, strangers' small; one request per
IP dials at a time, at most MAX_CONCURRENT_REQUESTS in all, strangers' fewer; a request past a
limit is answered with `error` and no dial. A request with nothing to dial costs nothing and is
not counted. The dial uses a throwaway key and stops after the Noise handshake, so the requester
never registers it as a connection (no muxer, no identify).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import trio
from libp2p.abc import IHost, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.io.trio import TrioTCPStream
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.transport.upgrader import TransportUpgrader

from p2ptrain.net.address_classes import (
    LOOPBACK_KIND,
    all_loopback,
    network_kind,
    public_prefix,
)
from p2ptrain.net.framing import read_frame, write_frame
from p2ptrain.net.inbound_gate import source_of
from p2ptrain.net.stream_end import end, ending
from p2ptrain.records import DialBackReply, DialBackRequest, DialResult
from p2ptrain.records.fields import json_value

log = logging.getLogger(__name__)

DIALBACK_PROTOCOL = TProtocol("/p2ptrain/dialback/1.0.0")
DIAL_TIMEOUT_S = 5.0  # one dial: TCP connect and the Noise handshake (a NAT drops: a timeout)
HANDLER_TIMEOUT_S = 12.0  # the whole exchange on the server: dials run concurrently
REQUEST_TIMEOUT_S = 15.0  # the client's wait, the stream's opening included
MAX_REQUEST_BYTES = 4 * 1024
MAX_REPLY_BYTES = 16 * 1024
MAX_DIALS_PER_REQUEST = 4
MIN_DIAL_PORT = 1024  # no dial-back to a well-known service port
# An honest node asks every few minutes, a `doctor` once; nodes behind one NAT (or a loopback
# swarm of many nodes) share an IP, hence 8 a minute per IP (per IPv6 /64: one host has a /64's
# addresses for free) and 64 in all. A /24 (IPv6 /48) of addresses is cheap to hold, hence a cap
# per prefix too. Members (and the organiser) have their budget; strangers (a `doctor`, a joiner
# not yet admitted) share a small one of their own, so that they cannot spend the members'.
REQUESTS_PER_IP = 8
REQUESTS_PER_PREFIX = 32
REQUESTS_TOTAL = 64
STRANGER_REQUESTS_PER_IP = 4
STRANGER_REQUESTS_PER_PREFIX = 8
STRANGER_REQUESTS_TOTAL = 16
RATE_WINDOW_S = 60.0
MAX_CONCURRENT_REQUESTS = 4
MAX_CONCURRENT_STRANGERS = 2  # of the 4: slow strangers' dials never hold the members' last 2
NOT_DIRECT = "not a direct connection"  # the refusal of a request seen from loopback


def tcp_target(maddr: str) -> tuple[str, int] | None:
    """(ip, port) of /ip4|ip6/IP/tcp/PORT[/p2p/ID], else None."""
    parts = maddr.split("/")
    if len(parts) < 5 or parts[0] != "" or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    if not _is_port(parts[4]) or (len(parts) > 5 and parts[5] != "p2p"):
        return None
    try:
        ip = str(ipaddress.ip_address(parts[2]))
    except ValueError:
        return None
    return ip, int(parts[4])


def tcp_maddr(ip: str, port: int) -> str:
    version = "ip6" if ":" in ip else "ip4"
    return f"/{version}/{ip}/tcp/{port}"


def tcp_port(maddr: str) -> int | None:
    """The TCP port of any multiaddr with one (a DNS name's too), else None."""
    parts = maddr.split("/")
    if "tcp" not in parts[:-1]:
        return None
    port = parts[parts.index("tcp") + 1]
    return int(port) if _is_port(port) else None


def _is_port(text: str) -> bool:
    """1-5 ASCII digits: str.isdigit() alone takes "²", which int() refuses."""
    return text.isascii() and text.isdigit() and len(text) <= 5


def dial_candidates(addrs: Sequence[str], observed_ip: str) -> list[tuple[str, int]]:
    """What a server dials for a request: the requested addresses on the requester's observed
    IP, then that IP at each requested port (a NAT's public side, which the requester cannot
    know; a DNS name's, which we do not resolve), ports >= MIN_DIAL_PORT, at most
    MAX_DIALS_PER_REQUEST, in request order."""
    observed = str(ipaddress.ip_address(observed_ip))
    own = [t for t in map(tcp_target, addrs) if t is not None and t[0] == observed]
    at_observed = [(observed, port) for port in map(tcp_port, addrs) if port is not None]
    candidates = [(ip, port) for ip, port in own + at_observed if port >= MIN_DIAL_PORT]
    return list(dict.fromkeys(candidates))[:MAX_DIALS_PER_REQUEST]


def _throwaway_upgrader() -> TransportUpgrader:
    """Noise with a fresh key: our dial-back is nobody the requester knows."""
    key_pair = create_new_key_pair(os.urandom(32))
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    return TransportUpgrader({NOISE_PROTOCOL_ID: noise}, cast(Any, {}))


async def dial_back(upgrader: TransportUpgrader, ip: str, port: int, peer: ID) -> str:
    """Open a fresh TCP connection to (ip, port) and complete a Noise handshake that proves the
    other end holds `peer`'s key; "" on success, else why not. Closed either way."""
    with trio.move_on_after(DIAL_TIMEOUT_S):
        try:
            tcp = await trio.open_tcp_stream(ip, port)
        except OSError as exc:
            return f"connect failed: {exc.strerror or type(exc).__name__}"
        raw = RawConnection(TrioTCPStream(tcp), True)
        try:
            secured = await upgrader.upgrade_security(raw, True, peer)
            with contextlib.suppress(Exception):
                await secured.close()
            return ""
        except Exception as exc:
            return f"handshake failed: {type(exc).__name__}"
        finally:
            with contextlib.suppress(Exception):
                await raw.close()
    return "timed out"


def decode_request(data: bytes) -> DialBackRequest:
    """A request frame's record; WireError for anything else (bytes that are not JSON too)."""
    return DialBackRequest.from_dict(json_value(data, "DialBackRequest"))


def decode_reply(data: bytes) -> DialBackReply:
    """A reply frame's record; WireError for anything else (bytes that are not JSON too)."""
    return DialBackReply.from_dict(json_value(data, "DialBackReply"))


class RequestBudget:
    """At most `per_source` requests per source (source_of: an IPv4 address, an IPv6 /64),
    `per_prefix` per public prefix (public_prefix: a /24, an IPv6 /48; none on loopback or a
    private network) and `total` in all per window of `window_s`. A refused request counts
    nowhere; the counters restart with each window, so memory stays within 2 * `total` keys."""

    def __init__(
        self, per_source: int, per_prefix: int, total: int, window_s: float = RATE_WINDOW_S
    ) -> None:
        self.per_source, self.per_prefix, self.total = per_source, per_prefix, total
        self.window_s = window_s
        self._window_start = float("-inf")
        self._sources: Counter[str] = Counter()
        self._prefixes: Counter[str] = Counter()
        self.num_refused = 0

    def allow(self, source: str, prefix: str, now: float) -> bool:
        """Count one request from `source` in `prefix` ('' : none) at `now` if all limits allow."""
        if now - self._window_start >= self.window_s:
            self._window_start = now
            self._sources.clear()
            self._prefixes.clear()
        if (
            self._sources.total() >= self.total
            or self._sources[source] >= self.per_source
            or (prefix and self._prefixes[prefix] >= self.per_prefix)
        ):
            self.num_refused += 1
            return False
        self._sources[source] += 1
        if prefix:
            self._prefixes[prefix] += 1
        return True


class DialBackServer:
    """Answers dial-back requests within the limits above. `own_addrs()`: our own listen
    addresses (all loopback: a swarm on one machine, where loopback requests are direct);
    `is_member(peer)`: whether a requester is a member of the run or the organiser (None:
    everyone is, one budget)."""

    def __init__(
        self,
        own_addrs: Callable[[], Sequence[str]],
        is_member: Callable[[str], bool] | None = None,
    ) -> None:
        self.own_addrs = own_addrs
        self.is_member = is_member
        self.members = RequestBudget(REQUESTS_PER_IP, REQUESTS_PER_PREFIX, REQUESTS_TOTAL)
        self.strangers = RequestBudget(
            STRANGER_REQUESTS_PER_IP, STRANGER_REQUESTS_PER_PREFIX, STRANGER_REQUESTS_TOTAL
        )
        self.num_dialling = 0
        self.num_strangers_dialling = 0
        self.dialling_from: set[str] = set()  # sources with a request dialling now
        self._upgrader = _throwaway_upgrader()

    async def handle(self, stream: INetStream) -> None:
        """A stream handler: one request frame, one reply frame."""
        try:
            with trio.move_on_after(HANDLER_TIMEOUT_S):
                request = decode_request(await read_frame(stream, MAX_REQUEST_BYTES))
                remote = stream.get_remote_address()
                if remote is None:
                    return
                reply = await self.answer(request, remote, stream.muxed_conn.peer_id)
                await write_frame(stream, json.dumps(reply.to_dict()).encode())
        except ValueError as exc:  # WireError (not a request), FrameError (not a frame)
            log.info("dropped a bad dial-back request: %s", exc)
        except Exception as exc:  # a vanished client is not our problem
            log.debug("dial-back request failed: %s", exc)
        finally:
            await end(stream, clean=True)  # bounded, whatever cancelled us

    async def answer(
        self, request: DialBackRequest, remote: tuple[str, int], peer: ID
    ) -> DialBackReply:
        """Dial the candidates of `request` from `remote` (the request connection's far end)."""
        ip, port = str(remote[0]), int(remote[1])
        observed = tcp_maddr(ip, port)
        if network_kind(ip) == LOOPBACK_KIND and not all_loopback(self.own_addrs()):
            return DialBackReply(observed, (), time.time(), NOT_DIRECT)
        candidates = dial_candidates(request.addrs, ip)
        if not candidates:  # nothing to dial costs us nothing: no budget spent, nobody's slot
            return DialBackReply(observed, (), time.time())
        stranger = self.is_member is not None and not self.is_member(peer.to_base58())
        # loopback (a swarm on one machine: every node is 127.0.0.1) has no source: it shares
        # the one budget and skips the one-per-IP rule
        source = source_of(ip)
        if (
            self.num_dialling >= MAX_CONCURRENT_REQUESTS
            or (stranger and self.num_strangers_dialling >= MAX_CONCURRENT_STRANGERS)
            or (source is not None and source in self.dialling_from)
        ):
            return DialBackReply(observed, (), time.time(), "busy")
        budget = self.strangers if stranger else self.members
        if not budget.allow(source or ip, public_prefix(ip), time.monotonic()):
            return DialBackReply(observed, (), time.time(), "rate limited")
        errors = [""] * len(candidates)

        async def dial(index: int) -> None:
            errors[index] = await dial_back(self._upgrader, *candidates[index], peer)

        self.num_dialling += 1
        self.num_strangers_dialling += stranger
        if source is not None:
            self.dialling_from.add(source)
        try:
            async with trio.open_nursery() as nursery:
                for index in range(len(candidates)):
                    nursery.start_soon(dial, index)
        finally:
            self.num_dialling -= 1
            self.num_strangers_dialling -= stranger
            self.dialling_from.discard(source or "")
        # one bit: the address that reached the requester (its own listener, proven by its key),
        # else nothing: which ports were closed or held by someone else is not ours to tell
        reached = [target for target, error in zip(candidates, errors, strict=True) if not error]
        results = tuple(DialResult(tcp_maddr(*target), True) for target in reached[:1])
        return DialBackReply(observed, results, time.time())


async def request_dial_back(host: IHost, peer: ID, addrs: Sequence[str]) -> DialBackReply:
    """Ask `peer` (connected) to dial us back at `addrs`; raises on timeout or a bad reply."""
    reply, _ = await ask_dial_back(host, peer, addrs)
    return reply


async def ask_dial_back(
    host: IHost, peer: ID, addrs: Sequence[str]
) -> tuple[DialBackReply, str | None]:
    """request_dial_back, and the server's IP as seen on the request's connection (None if
    unknown): whose opinion the reply is (control/reachability.py)."""
    request = json.dumps(DialBackRequest(tuple(addrs)).to_dict()).encode()
    with trio.fail_after(REQUEST_TIMEOUT_S):
        stream = await host.new_stream(peer, [DIALBACK_PROTOCOL])
        async with ending(stream):  # reset on a timeout: net/stream_end.py
            remote = stream.get_remote_address()
            await write_frame(stream, request)
            reply = decode_reply(await read_frame(stream, MAX_REPLY_BYTES))
            return reply, None if remote is None else str(remote[0])
