"""One guard for every task that serves one connection, stream or request.

What a peer sends may make such a task fail in any way (a reset mid-read raises
`trio.BrokenResourceError`, not an `OSError`; a library decoder raises its own types). None of that
may reach a node-lifetime nursery, whose failure ends the process: a per-connection task runs
under `contained`, which logs and drops any `Exception` and lets cancellation through. Nurseries
that live as long as the node hold only services; what they start per connection goes through
`start_contained`. A peer can make such failures at will: they are logged 1 line in 100 per
kind (sampled_log.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)
# keyed by the `what` of the code that starts the task, never by anything of the peer's
_failures = SampledLog(log)

Task = Callable[..., Awaitable[Any]]


class _Resettable(Protocol):
    async def reset(self) -> None: ...


async def contained(what: str, task: Task, *args: Any) -> None:
    """Run `task(*args)`; an `Exception` it raises (an exception group included) is logged at
    INFO (1 line in 100 per `what`) and dropped. Cancellation and `KeyboardInterrupt` are not
    exceptions of the peer's making and pass through."""
    try:
        await task(*args)
    except Exception as exc:
        _failures.event(what, "%s failed and was dropped: %s: %s", what, type(exc).__name__, exc)


def start_contained(nursery: trio.Nursery, what: str, task: Task, *args: Any) -> None:
    """`nursery.start_soon(task, *args)` under `contained`: its failure ends only itself."""
    nursery.start_soon(contained, what, task, *args)


def guard_stream_handler(
    what: str, handler: Callable[[Any], Awaitable[None]]
) -> Callable[[Any], Awaitable[None]]:
    """A stream handler that turns any `Exception` of `handler` into resetting that stream
    (logged 1 line in 100)."""
    failures = SampledLog(log)

    async def guarded(stream: Any) -> None:
        try:
            await handler(stream)
        except Exception as exc:
            protocol = getattr(stream, "get_protocol", lambda: None)()
            failures.event(
                "failed",
                "%s stream (%s) failed and was reset: %s: %s",
                what,
                protocol,
                type(exc).__name__,
                exc,
            )
            with contextlib.suppress(Exception):
                await stream.reset()

    return guarded


def guard_inbound_streams(host: Any) -> None:
    """Run every inbound stream of a py-libp2p `host` under `guard_stream_handler`.

    The swarm hands each new stream to one handler: the host's protocol negotiation, then the
    handler of the protocol chosen, ours or one the library registered itself (GossipSub's reader,
    identify, Kademlia, ping) or registers later. An exception there escapes the connection's
    nursery and the swarm service, and ends the host (GossipSub's reader raised protobuf's
    `DecodeError` on one garbage frame). Guarding that one entry point covers every protocol,
    present and future."""
    network = host.get_network()
    network.set_stream_handler(guard_stream_handler("inbound", network.common_stream_handler))
