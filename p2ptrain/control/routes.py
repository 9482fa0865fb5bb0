"""A NATed node's local routes to NATed members: one 127.0.0.1 listener per (peer, plane), whose
connections are carried to the peer punched or relayed (control/traversal.py: reach).

A route is a socket and a task, and a member's record alone opens one (discovery dials every
member, through a route when both of us are NATed), so in an open run every throwaway identity
with a private record and a relay cost a listener for the node's life, and past the descriptor
limit the failed listen ended the node. So a route goes when its member does (`close`), at most
MAX_ROUTES are open, and past that a new one takes the place of the longest-open route that
carries nothing now and whose peer is not in the plan; if every one does, none is opened (the
caller dials as if there were no route) and the refusal is logged, sampled.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import trio

from p2ptrain.net.accepting import ConnectionCaps, serve_accepting
from p2ptrain.sampled_log import SampledLog
from p2ptrain.traversal.splice import splice

log = logging.getLogger(__name__)

MAX_ROUTES = 256  # listeners: a NATed node routes to this many (member, plane) pairs at once
MAX_ROUTE_CONNECTIONS = 32  # on one route's listener: a peer's plane dials it a few times
Reach = Callable[[str, str], Awaitable[trio.SocketStream | None]]


@dataclass
class Route:
    port: int
    caps: ConnectionCaps
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class Routes:
    """The open routes of one node; `reach(peer, plane)` connects to a peer's plane;
    `planned()` the peers of the current plan (their routes are never taken over); `closed(port)`
    is told of each route that closes."""

    def __init__(
        self,
        reach: Reach,
        planned: Callable[[], Collection[str]],
        closed: Callable[[int], None] = lambda port: None,
        max_routes: int = MAX_ROUTES,
    ) -> None:
        self.reach = reach
        self.planned = planned
        self.closed = closed
        self.max_routes = max_routes
        self.open: dict[tuple[str, str], Route] = {}  # in the order they were opened
        # routes whose listener is being opened -> closed meanwhile (`close` came during it)
        self._opening: dict[tuple[str, str], bool] = {}
        self._opened: dict[tuple[str, str], trio.Event] = {}  # set when that listen is done
        self.num_refused = 0
        self._nursery: trio.Nursery | None = None
        self._log = SampledLog(log)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Carry the routes' connections while the node runs."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def port(self, peer: str, plane: str) -> int | None:
        """The local port of the route to `peer`'s plane, opened on first use; None if no room."""
        key = (peer, plane)
        if key in self.open:
            return self.open[key].port
        if key in self._opening:  # another dial is opening it: its outcome is ours
            await self._opened[key].wait()
            return self.open[key].port if key in self.open else None
        assert self._nursery is not None, "routes exist once serve() has started"
        # the routes being opened count too: dials run side by side, and each awaits its listen
        busy = len(self.open) + len(self._opening)
        if busy >= self.max_routes and not self._make_room():
            self.num_refused += 1
            self._log.event("full", "no route to %s (%s): %d routes busy", peer, plane, busy)
            return None
        self._opening[key], self._opened[key] = False, trio.Event()
        try:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        except OSError as exc:  # out of descriptors or ports: this peer goes without
            self.num_refused += 1
            self._log.event("listen", "no route to %s (%s): %s", peer, plane, exc)
            return None
        finally:
            closed_meanwhile = self._opening.pop(key)
            self._opened.pop(key).set()  # the route is in `open` (below) before a waiter runs
        if closed_meanwhile:  # its member went while we listened: no route for it
            for listener in listeners:
                listener.socket.close()
            return None
        caps = ConnectionCaps(MAX_ROUTE_CONNECTIONS, MAX_ROUTE_CONNECTIONS)
        route = Route(listeners[0].socket.getsockname()[1], caps)
        self.open[key] = route
        self._nursery.start_soon(self._serve, route, listeners[0], peer, plane)
        return route.port

    def close(self, peer: str) -> None:
        """Close `peer`'s routes (every plane), with what they carry, and any being opened."""
        for key in [key for key in self.open if key[0] == peer]:
            self._close(key)
        for key in self._opening:
            if key[0] == peer:
                self._opening[key] = True

    def _make_room(self) -> bool:
        planned = set(self.planned())
        for (peer, plane), route in self.open.items():
            if peer not in planned and route.caps.open == 0:
                self._close((peer, plane))
                return True
        return False

    def _close(self, key: tuple[str, str]) -> None:
        route = self.open.pop(key)
        route.scope.cancel()
        self.closed(route.port)

    async def _serve(
        self, route: Route, listener: trio.SocketListener, peer: str, plane: str
    ) -> None:
        carry = functools.partial(self._carry, peer=peer, plane=plane)
        with route.scope:
            try:
                await serve_accepting(listener, carry, route.caps, f"route to {peer} ({plane})")
            finally:
                listener.socket.close()

    async def _carry(self, local: trio.SocketStream, peer: str, plane: str) -> None:
        remote = await self.reach(peer, plane)
        if remote is None:
            await local.aclose()
            return
        await splice(local, remote)
