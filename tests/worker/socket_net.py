"""Stands in for the p2pd daemons in the kept-stream tests (outer rounds' and pipeline frames'):
a stream opened to a protocol is a real socket on 127.0.0.1 to the handler registered for it,
which sees the opener's peer id as p2pd would report it."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[Any, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def stream_info(peer: str) -> Any:
    """What a handler is given of a stream's peer (hivemind's StreamInfo, its peer id only)."""
    return types.SimpleNamespace(peer_id=types.SimpleNamespace(to_base58=lambda: peer))


class SocketNet:
    """Handlers by protocol; `opened`: the protocol of every stream opened, in order."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.opened: list[str] = []

    async def open(self, sender: str, protocol: str) -> tuple[Any, Any]:
        """A stream to `protocol`'s handler, as `sender`; ConnectionError if none serves it."""
        handler = self.handlers.get(protocol)
        if handler is None:
            raise ConnectionError(f"protocol not supported: {protocol}")

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await handler(stream_info(sender), reader, writer)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        stream = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        self.opened.append(protocol)
        return stream
