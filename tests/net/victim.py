"""A "victim": a TCP listener on 127.0.0.1 outside the swarm that counts the connections it
gets (issue 26: honest nodes must not be made to dial third parties)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import trio


@dataclass
class Victim:
    port: int
    connections: int = 0

    @property
    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}"


@asynccontextmanager
async def open_victim() -> AsyncIterator[Victim]:
    """Each connection is counted, then closed at once (no libp2p behind it)."""
    async with trio.open_nursery() as nursery:
        victim = Victim(0)

        async def count(stream: trio.SocketStream) -> None:
            victim.connections += 1
            await stream.aclose()

        listeners = await nursery.start(partial(trio.serve_tcp, count, 0, host="127.0.0.1"))
        victim.port = listeners[0].socket.getsockname()[1]
        yield victim
        nursery.cancel_scope.cancel()
