"""A NATed node's local routes (control/routes.py), with real sockets on 127.0.0.1: a route
closes with its member, at most so many are open, and a failed listen costs one route only.
Each route used to stay open for the node's life, one per member record ever seen (an open
run's throwaway identities), until the descriptors ran out and the failed listen ended it."""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from p2ptrain.control import routes as routes_module
from p2ptrain.control.membership import Member, Membership
from p2ptrain.control.routes import Routes
from p2ptrain.records import PeerRecord
from tests.net.trio_run import run


async def _silent_peer(nursery: trio.Nursery) -> Callable[[str, str], Awaitable[Any]]:
    """reach(): a connection to a local listener that holds what it accepts."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    held: list[trio.SocketStream] = []

    async def hold() -> None:
        while True:
            held.append(await listeners[0].accept())

    nursery.start_soon(hold)
    port = listeners[0].socket.getsockname()[1]

    async def reach(peer: str, plane: str) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", port)

    return reach


async def _accepts(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return False
    await stream.aclose()
    return True


def test_a_members_routes_close_when_membership_forgets_it() -> None:
    async def main() -> tuple[bool, bool, bool]:
        async with trio.open_nursery() as nursery:
            closed: list[int] = []
            routes = Routes(await _silent_peer(nursery), lambda: (), closed.append)
            await nursery.start(routes.serve)
            members = Membership()
            members.when_forgotten(routes.close)
            members["sybil"] = Member(PeerRecord((), "trainer", False, "0.1.0", {}), 0.0)
            ports = [await routes.port("sybil", plane) for plane in ("control", "data")]
            before = all([await _accepts(port) for port in ports if port])
            del members["sybil"]
            await trio.sleep(0.1)
            after = any([await _accepts(port) for port in ports if port])
            nursery.cancel_scope.cancel()
        return before, after, sorted(closed) == sorted(p for p in ports if p)

    before, after, closed_are_ours = run(main)
    assert before and not after
    assert closed_are_ours


def test_past_the_cap_an_idle_unplanned_route_makes_room_and_planned_ones_never_do() -> None:
    async def main() -> dict[str, Any]:
        async with trio.open_nursery() as nursery:
            planned: set[str] = set()
            routes = Routes(await _silent_peer(nursery), lambda: planned, max_routes=3)
            await nursery.start(routes.serve)
            first = await routes.port("a", "control")
            await routes.port("b", "control")
            busy = await routes.port("c", "control")
            assert first and busy
            carried = await trio.open_tcp_stream("127.0.0.1", busy)  # c carries a connection
            await trio.sleep(0.1)
            taken = await routes.port("d", "control")  # a goes: the oldest idle, unplanned
            a_gone = not await _accepts(first) and ("a", "control") not in routes.open
            planned.update({"b", "d"})
            refused = await routes.port("e", "control")  # b, d planned; c busy: no room
            result = {
                "taken": taken,
                "a_gone": a_gone,
                "refused": refused,
                "open": sorted(peer for peer, _ in routes.open),
                "num_refused": routes.num_refused,
            }
            await carried.aclose()
            nursery.cancel_scope.cancel()
        return result

    result = run(main)
    assert result["taken"] is not None and result["a_gone"]
    assert result["refused"] is None and result["num_refused"] == 1
    assert result["open"] == ["b", "c", "d"]


def test_a_failed_listen_costs_that_route_only(monkeypatch: pytest.MonkeyPatch) -> None:
    async def out_of_descriptors(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EMFILE, "Too many open files")

    async def main() -> tuple[int | None, int | None, int]:
        async with trio.open_nursery() as nursery:
            routes = Routes(await _silent_peer(nursery), lambda: ())
            await nursery.start(routes.serve)
            with monkeypatch.context() as patch:
                patch.setattr(routes_module.trio, "open_tcp_listeners", out_of_descriptors)
                failed = await routes.port("x", "control")
            later = await routes.port("x", "control")
            nursery.cancel_scope.cancel()
        return failed, later, routes.num_refused

    failed, later, refused = run(main)
    assert failed is None and refused == 1
    assert later is not None  # descriptors back: the route opens


def test_dials_side_by_side_stay_within_the_cap_and_a_member_gone_meanwhile_gets_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cap was checked before the listen's await and the route added after it: dials
    running side by side each passed it, and a `close` during the await missed the route,
    which then opened for a forgotten member."""
    real_listen = trio.open_tcp_listeners

    async def slow_listen(*args: Any, **kwargs: Any) -> Any:
        await trio.sleep(0.2)  # getaddrinfo and bind yield: others run meanwhile
        return await real_listen(*args, **kwargs)

    async def main() -> tuple[list[int | None], int, int | None, int]:
        async with trio.open_nursery() as nursery:
            routes = Routes(
                await _silent_peer(nursery), lambda: {f"p{n}" for n in range(8)}, max_routes=4
            )
            await nursery.start(routes.serve)
            monkeypatch.setattr(routes_module.trio, "open_tcp_listeners", slow_listen)
            ports: list[int | None] = []

            async def dial(peer: str) -> None:
                ports.append(await routes.port(peer, "control"))

            async with trio.open_nursery() as dials:
                for n in range(8):
                    dials.start_soon(dial, f"p{n}")
            num_open = len(routes.open)
            gone: list[int | None] = []

            async def dial_gone() -> None:
                gone.append(await routes.port("gone", "control"))

            routes.close(next(iter(routes.open))[0])  # room for one more
            async with trio.open_nursery() as dials:
                dials.start_soon(dial_gone)
                await trio.sleep(0.05)
                routes.close("gone")  # its member is forgotten while the listen runs
            nursery.cancel_scope.cancel()
        return ports, num_open, gone[0], len(routes.open)

    ports, num_open, gone, open_after = run(main)
    assert num_open == 4 and sum(p is not None for p in ports) == 4  # was 8 open
    assert gone is None and open_after == 3


def test_a_second_dial_of_a_route_being_opened_gets_its_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It got None (no route: a dial without the pinned local route) while the first dial's
    listen ran."""
    real_listen = trio.open_tcp_listeners

    async def slow_listen(*args: Any, **kwargs: Any) -> Any:
        await trio.sleep(0.2)
        return await real_listen(*args, **kwargs)

    async def main() -> list[int | None]:
        async with trio.open_nursery() as nursery:
            routes = Routes(await _silent_peer(nursery), lambda: ())
            await nursery.start(routes.serve)
            monkeypatch.setattr(routes_module.trio, "open_tcp_listeners", slow_listen)
            ports: list[int | None] = []

            async def dial() -> None:
                ports.append(await routes.port("x", "control"))

            async with trio.open_nursery() as dials:
                dials.start_soon(dial)
                dials.start_soon(dial)
            nursery.cancel_scope.cancel()
        return ports

    first, second = run(main)
    assert first is not None and first == second
