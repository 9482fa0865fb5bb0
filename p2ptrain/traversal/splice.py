"""Splicing two TCP streams into one connection: the two halves of a relay's circuit
(traversal/relay.py), or a punched or relayed connection and the local port it carries
(control/traversal.py, control/routes.py). Bytes are copied both ways and counted; a splice ends
at a byte cap each way or when idle.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import trio

from p2ptrain.net.guard import start_contained

log = logging.getLogger("p2ptrain.traversal.relay")  # as before the split: operators grep it

MAX_CIRCUIT_BYTES = 4 * 1024**3  # each way; then the circuit is reset
_CHUNK = 64 * 1024


@dataclass
class RelayCounters:
    """What a relay moved: bytes each way over all circuits, circuits opened and refused."""

    bytes_relayed: int = 0
    circuits: int = 0
    refused: int = 0
    active: int = 0


async def splice(
    a: trio.SocketStream,
    b: trio.SocketStream,
    counters: RelayCounters | None = None,
    max_bytes: int = MAX_CIRCUIT_BYTES,
    idle_s: float | None = None,
) -> None:
    """Copy both ways until either side ends (or max_bytes one way, or no byte either way for
    idle_s); then close both. A copy's failure, whatever it is, ends only this splice."""
    last_byte = [trio.current_time()]

    async def copy(source: trio.SocketStream, sink: trio.SocketStream) -> None:
        moved = 0
        try:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                while moved < max_bytes:
                    chunk = await source.receive_some(_CHUNK)
                    if not chunk:
                        break
                    last_byte[0] = trio.current_time()
                    await sink.send_all(chunk)
                    moved += len(chunk)
                    if counters is not None:
                        counters.bytes_relayed += len(chunk)
        finally:
            nursery.cancel_scope.cancel()  # one side ended: the libp2p connection is over

    async def close_when_idle(idle_s: float) -> None:
        while True:  # sleep until idle_s after the last byte; a byte since moves the alarm
            await trio.sleep_until(last_byte[0] + idle_s)
            if trio.current_time() - last_byte[0] >= idle_s:
                break
        log.info("closed a circuit idle for %.0f s", idle_s)
        nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            start_contained(nursery, "splice copy", copy, a, b)
            start_contained(nursery, "splice copy", copy, b, a)
            if idle_s is not None:
                nursery.start_soon(close_when_idle, idle_s)
    finally:
        for stream in (a, b):
            with contextlib.suppress(Exception):
                await stream.aclose()
