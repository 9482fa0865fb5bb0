"""The relay port's two pools (net/accepting.py, traversal/relay.py): connections waiting for
their hello are capped per source, per public /24 (IPv6 /48) and in all, apart from the halves
of granted circuits, which move to a pool of their own. The audit's attack: 8 addresses of one
/24 held all 512 places with idle connections (each reopened after the 3 s hello wait), and
honest circuit halves and observes were refused."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import trio

from p2ptrain.net.accepting import ConnectionCaps, Seat
from p2ptrain.records.relay import RAW_CIRCUIT
from p2ptrain.traversal import relay
from tests.net.trio_run import run

PREFIX = "81.2.69.0/24"


def test_caps_count_each_public_prefix_too() -> None:
    caps = ConnectionCaps(per_source=4, total=100, per_prefix=6)
    admitted = [caps.admit(f"81.2.69.{n}", PREFIX) for n in range(1, 5) for _ in range(4)]
    assert admitted.count(True) == 6
    assert caps.admit("81.2.70.1", "81.2.70.0/24")  # another /24
    assert caps.admit("127.0.0.1") and caps.admit("127.0.0.1")  # no prefix: loopback, a LAN
    for n in (1, 1, 1, 1, 2, 2):
        caps.release(f"81.2.69.{n}", PREFIX)
    assert caps.open_by_prefix == {"81.2.70.0/24": 1}


def test_a_seat_moves_only_where_there_is_room() -> None:
    hellos, halves = ConnectionCaps(4, 4), ConnectionCaps(1, 1)
    first, second = (Seat(hellos, "81.2.69.1", PREFIX) for _ in range(2))
    assert hellos.admit(first.source, first.prefix) and hellos.admit(second.source, PREFIX)
    assert first.move(halves) and first.caps is halves and hellos.open == 1
    assert not second.move(halves) and second.caps is hellos and hellos.open == 1


def test_one_slash_24_of_idle_strangers_leaves_the_relay_port_to_others() -> None:
    relay_server = relay.RelayServer(lambda peer: True)
    held = sum(
        relay_server.caps.admit(f"81.2.69.{n}", PREFIX) for n in range(1, 9) for _ in range(64)
    )
    assert held == relay.MAX_RAW_HELLOS_PER_PREFIX
    # an honest observe or half from elsewhere still finds a place; the halves' pool is untouched
    assert relay_server.caps.admit("81.2.100.7", "81.2.100.0/24")
    assert relay_server.circuit_caps.open == 0
    many = sum(
        relay_server.caps.admit(f"81.{n}.1.1", f"81.{n}.1.0/24")
        for n in range(200)
        for _ in range(16)
    )
    assert many + held + 1 == relay.MAX_RAW_HELLOS  # the waiting pool is all strangers get
    assert relay.MAX_RAW_CONNECTIONS == relay.MAX_RAW_HELLOS + 2 * relay.MAX_CIRCUITS


def test_a_granted_half_leaves_the_hello_pool_and_idle_ones_cannot_take_its_place() -> None:
    """On loopback (no prefix): a waiting pool of 2. The first half moves to the circuits' pool;
    two idle connections then fill the waiting pool, a third is closed at once; once they go,
    the second half joins and the circuit carries bytes."""
    relay_server = relay.RelayServer(lambda peer: True)
    relay_server.caps = ConnectionCaps(per_source=2, total=2)

    async def until(condition: Callable[[], bool]) -> None:
        for _ in range(500):  # a hang guard: the relay's tasks see the bytes soon
            if condition():
                return
            await trio.sleep(0.01)
        raise AssertionError("the relay never got there")

    async def main() -> tuple[list[int], bytes, bytes, list[int]]:
        relay_server.reserve("B", 0.0)
        _, token = relay_server.grant("A", "B", 0.0)
        hellos, halves = relay_server.caps, relay_server.circuit_caps
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            await nursery.start(relay_server.serve_raw, listeners[0])
            address = ("127.0.0.1", int(listeners[0].socket.getsockname()[1]))
            a = await relay.open_raw(address, RAW_CIRCUIT, token)
            await until(lambda: halves.open == 1 and hellos.open == 0)
            idle = [await trio.open_tcp_stream(*address) for _ in range(2)]
            await until(lambda: hellos.open == 2)
            refused = await trio.open_tcp_stream(*address)
            with trio.fail_after(5), contextlib.suppress(trio.BrokenResourceError):
                closed_at_once = await refused.receive_some(1)
            counts = [hellos.open, halves.open]
            for stream in [*idle, refused]:
                await stream.aclose()
            await until(lambda: hellos.open == 0)
            b = await relay.open_raw(address, RAW_CIRCUIT, token)
            await a.send_all(b"through")
            got = await relay.receive_exact(b, 7)
            spliced = [hellos.open, halves.open]
            await a.aclose()
            await b.aclose()
            nursery.cancel_scope.cancel()
        return counts, closed_at_once, got, spliced

    counts, closed_at_once, got, spliced = run(main)
    assert counts == [2, 1] and closed_at_once == b""
    assert got == b"through" and spliced == [0, 2]
