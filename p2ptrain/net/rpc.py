"""Tiny request/response over one libp2p stream: one framed request, one framed JSON reply."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2ptrain.net.framing import read_frame, write_frame

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 10.0  # generous: a node on a loaded 2-core box can stall for seconds
MAX_REQUEST_BYTES = 4 * 1024
MAX_REPLY_BYTES = 4 * 1024 * 1024

Responder = Callable[[bytes], Awaitable[dict[str, Any]]]


def make_handler(respond: Responder) -> Callable[[INetStream], Awaitable[None]]:
    """A stream handler that reads one request (<= 4 KiB), answers with respond()'s JSON."""

    async def handle(stream: INetStream) -> None:
        try:
            with trio.move_on_after(RPC_TIMEOUT_S):
                request = await read_frame(stream, MAX_REQUEST_BYTES)
                reply = json.dumps(await respond(request), separators=(",", ":")).encode()
                await write_frame(stream, reply[:MAX_REPLY_BYTES])
        except Exception as exc:
            log.info("dropped a bad %s request: %s", stream.get_protocol(), exc)
        finally:
            with contextlib.suppress(Exception):
                await stream.close()

    return handle


async def call(host: IHost, peer: ID, protocol: TProtocol, request: bytes = b"") -> Any:
    """Send one request and return the decoded JSON reply; raises on timeout or bad reply."""
    with trio.fail_after(RPC_TIMEOUT_S):
        stream = await host.new_stream(peer, [protocol])
        try:
            await write_frame(stream, request)
            return json.loads(await read_frame(stream, MAX_REPLY_BYTES))
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
