"""How a stream we opened or answered ends: closed after a clean exchange, reset after a
failure or a cancellation, and either way shielded from the caller's cancellation and bounded.

A `finally: await stream.close()` under a `fail_after` that fired runs in the cancelled scope:
py-libp2p's yamux close waits on a lock first, that wait raised `Cancelled` at once (no
`suppress(Exception)` catches it), and nothing was sent. The stream kept its slot (256 per
connection, given back only on our own close or reset, or on the far end's reset: a late
answer's FIN does not) and up to a receive window of the late reply, for the connection's life;
after 256 timed-out calls to one peer, no new stream to it could open. A reset tells the far end
at once, where a close would wait for its reply.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio
from libp2p.abc import INetStream

END_TIMEOUT_S = 1.0  # a close or reset sends one frame: a stuck connection is not waited for


async def end(stream: INetStream, clean: bool) -> None:
    """Close (`clean`) or reset `stream`, whatever the caller's cancellation, within
    END_TIMEOUT_S; never raises."""
    with trio.move_on_after(END_TIMEOUT_S) as scope, contextlib.suppress(Exception):
        scope.shield = True
        if clean:
            await stream.close()
        else:
            await stream.reset()


@contextlib.asynccontextmanager
async def ending(stream: INetStream) -> AsyncIterator[INetStream]:
    """`stream` for one exchange: closed if the body completes, reset if it raises or is
    cancelled (the exception goes on)."""
    clean = False
    try:
        yield stream
        clean = True
    finally:
        await end(stream, clean)
