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
port of its own IP completes a handshake with its own key. Requests are rate-limited per
requester IP and in all, and at most MAX_CONCURRENT_REQUESTS are dialling at once; a request past
a limit is answered with `error` and no dial. The dial uses a throwaway key and stops after the
Noise handshake, so the requester never registers it as a connection (no muxer, no identify).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import time
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

from p2ptrain.addresses import LOOPBACK_KIND, all_loopback, network_kind
from p2ptrain.net.framing import read_frame, write_frame
from p2ptrain.net.inbound_gate import source_of
from p2ptrain.net.ratelimit import WindowLimiter
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
# addresses for free) and 64 in all.
REQUESTS_PER_IP = 8
REQUESTS_TOTAL = 64
RATE_WINDOW_S = 60.0
MAX_CONCURRENT_REQUESTS = 4
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


class DialBackServer:
    """Answers dial-back requests within the limits above. `own_addrs()`: our own listen
    addresses (all loopback: a swarm on one machine, where loopback requests are direct)."""

    def __init__(self, own_addrs: Callable[[], Sequence[str]]) -> None:
        self.own_addrs = own_addrs
        self.limiter = WindowLimiter(REQUESTS_PER_IP, REQUESTS_TOTAL, RATE_WINDOW_S)
        self.num_dialling = 0
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
        if self.num_dialling >= MAX_CONCURRENT_REQUESTS:
            return DialBackReply(observed, (), time.time(), "busy")
        if not self.limiter.allow(source_of(ip) or ip, time.monotonic()):
            return DialBackReply(observed, (), time.time(), "rate limited")
        candidates = dial_candidates(request.addrs, ip)
        errors = [""] * len(candidates)

        async def dial(index: int) -> None:
            errors[index] = await dial_back(self._upgrader, *candidates[index], peer)

        self.num_dialling += 1
        try:
            async with trio.open_nursery() as nursery:
                for index in range(len(candidates)):
                    nursery.start_soon(dial, index)
        finally:
            self.num_dialling -= 1
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
