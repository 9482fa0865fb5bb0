"""A punch's endpoint is a relay's word: a hostile target's relay (the dialer's side) or a relay
of ours (the target's) aimed honest nodes' punches, and the 17-byte hello, at any IPv4:port,
again on every route connection. Now each way: no port below 1024, a rate per peer and in all,
and an endpoint that never proved to be the peer is not punched again for a while
(control/punch_limits.py: PunchLimits). Real sockets on 127.0.0.1; the clock is a fake."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio

from p2ptrain.control import punch_limits, relay_slots
from p2ptrain.control.punch_limits import (
    ENDPOINT_BACKOFF_S,
    PUNCH_WINDOW_S,
    PUNCHES_IN_ALL,
    PUNCHES_PER_PEER,
    PunchLimits,
)
from p2ptrain.control.traversal import Traversal
from p2ptrain.records.relay import RAW_PUNCHED, RawHello, RelayReply
from tests.control.test_traversal_attacks import (
    SOURCE,
    TARGET,
    TOKEN,
    attacker,
    hold_silently,
    nated_node,
    offer,
    relay_port,
)
from tests.net.trio_run import run


def test_the_limits_refuse_low_ports_past_the_rate_and_unproven_endpoints() -> None:
    limits = PunchLimits()
    assert "below port 1024" in limits.refusal(TARGET, "203.0.113.9:1023", 0.0)
    assert limits.refusal(TARGET, "203.0.113.9:1024", 0.0) == ""
    # the same endpoint again: backed off until proven, or until ENDPOINT_BACKOFF_S passed
    assert "never proved" in limits.refusal(SOURCE, "203.0.113.9:1024", 1.0)
    assert limits.refusal(SOURCE, "203.0.113.9:1024", ENDPOINT_BACKOFF_S) == ""
    limits.proven("203.0.113.9:1024")
    assert limits.refusal(SOURCE, "203.0.113.9:1024", ENDPOINT_BACKOFF_S + 1) == ""

    limits, now = PunchLimits(), 1000.0
    allowed = [limits.refusal(TARGET, f"203.0.113.1:{2000 + i}", now) == "" for i in range(100)]
    assert allowed == [True] * PUNCHES_PER_PEER + [False] * (100 - PUNCHES_PER_PEER)
    peers = [f"peer{i}" for i in range(2 * PUNCHES_IN_ALL)]
    others = [limits.refusal(p, f"203.0.113.2:{2000 + i}", now) for i, p in enumerate(peers)]
    assert sum(why == "" for why in others) == PUNCHES_IN_ALL - PUNCHES_PER_PEER
    assert others[-1] == "punching as often as we may"
    assert limits.refusal(TARGET, "203.0.113.3:2000", now + PUNCH_WINDOW_S) == ""  # next window


def test_the_backed_off_endpoints_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(punch_limits, "MAX_BACKED_OFF", 8)
    limits = PunchLimits()
    for i in range(20):
        assert limits.refusal(f"peer{i}", f"203.0.113.1:{2000 + i}", float(i)) == ""
    assert list(limits.unproven) == [f"203.0.113.1:{2000 + i}" for i in range(12, 20)]
    limits.refusal("late", "203.0.113.1:3000", 19 + ENDPOINT_BACKOFF_S)  # the old ones expire
    assert list(limits.unproven) == ["203.0.113.1:3000"]


class HostileRelay:
    """A target's relay that skips `vouch`: it answers a punch's connect with endpoints of its
    choosing, one after another."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints

    async def request(self, state: Any, relay_id: str, message: Any) -> RelayReply:
        return RelayReply(token=TOKEN, endpoint=self.endpoints.pop(0))


async def victim(nursery: trio.Nursery, reached: list[bytes]) -> str:
    """A listener that is no peer of ours: it notes every connection's first bytes."""

    async def note(listener: trio.SocketListener) -> None:
        while True:
            stream = await listener.accept()
            reached.append(await stream.receive_some(64))
            await stream.aclose()

    return await attacker(nursery, note)


async def punches(traversal: Traversal, raw: tuple[str, int], count: int) -> list[bool]:
    """`count` punches to TARGET as route connections make them: connected or not."""
    connected = []
    for _ in range(count):
        stream = await traversal._try_punch("R", raw, TARGET, "data")
        connected.append(stream is not None)
        if stream is not None:
            await stream.aclose()
    return connected


def dialer(port: int, now: list[float]) -> Traversal:
    traversal = nated_node(port)
    traversal.clock = lambda: now[0]
    return traversal


def test_a_dialer_punches_an_endpoint_that_never_proved_the_target_once(monkeypatch: Any) -> None:
    """The audit's reflection: each route connection connected to the victim and sent it the
    hello. Now once per ENDPOINT_BACKOFF_S (a punch's proof, the plane's Noise handshake, lies
    past the splice; an honest target answers a fresh endpoint each punch)."""
    now = [0.0]

    async def main() -> tuple[list[bool], list[bytes], list[bool]]:
        reached: list[bytes] = []
        async with trio.open_nursery() as nursery:
            port = await relay_port(nursery)
            endpoint = await victim(nursery, reached)
            hostile = HostileRelay([endpoint] * 4)
            monkeypatch.setattr(relay_slots, "request", hostile.request)
            traversal = dialer(port, now)
            first = await punches(traversal, ("127.0.0.1", port), 3)
            with trio.fail_after(10):  # a hang guard: the victim notes its one connection
                while not reached:  # noqa: ASYNC110 - no event to wait on
                    await trio.sleep(0.01)
            now[0] = ENDPOINT_BACKOFF_S  # the back-off over: punched once more
            later = await punches(traversal, ("127.0.0.1", port), 1)
            nursery.cancel_scope.cancel()
        return first, reached, later

    first, reached, later = run(main)
    assert first == [True, False, False]
    assert reached[:1] == [RawHello(RAW_PUNCHED, bytes.fromhex(TOKEN)).encode()]
    assert later == [True]


def test_a_dialer_refuses_low_ports_and_punches_past_the_rate(monkeypatch: Any) -> None:
    monkeypatch.setattr(punch_limits, "PUNCHES_PER_PEER", 2)
    now = [0.0]

    async def main() -> tuple[list[bool], int, list[bool]]:
        reached: list[bytes] = []
        async with trio.open_nursery() as nursery:
            port = await relay_port(nursery)
            victims = [await victim(nursery, reached) for _ in range(4)]
            hostile = HostileRelay(["127.0.0.1:80", "127.0.0.1:1023", *victims])
            monkeypatch.setattr(relay_slots, "request", hostile.request)
            traversal = dialer(port, now)
            raw = ("127.0.0.1", port)
            connected = await punches(traversal, raw, 5)  # 2 low ports, 2 victims, 1 past
            with trio.fail_after(10):  # a hang guard: the victims note their connections
                while len(reached) < 2:  # noqa: ASYNC110 - no event to wait on
                    await trio.sleep(0.01)
            punched = len(reached)
            now[0] = PUNCH_WINDOW_S  # the next window
            connected += await punches(traversal, raw, 1)
            nursery.cancel_scope.cancel()
        return connected, punched, [traversal.punch_failed == {}]

    connected, punched, nothing_failed = run(main)
    assert connected == [False, False, True, True, False, True] and punched == 2
    assert nothing_failed == [True]  # refusals are no NAT verdict: the peer is not relayed for it


async def punches_in_ended(traversal: Traversal) -> None:
    with trio.fail_after(10):  # a hang guard: a punch ends when its far end closes
        while traversal.punching_in:  # noqa: ASYNC110 - no event to wait on
            await trio.sleep(0.01)


def test_a_target_refuses_low_ports_rates_offers_and_backs_off_unproven_ones(
    monkeypatch: Any,
) -> None:
    """A relay of ours offering punches in a loop at a victim's closed or silent port: each
    freed its place after a round trip, so only the stream rate bounded them."""
    monkeypatch.setattr(punch_limits, "PUNCHES_PER_PEER", 3)
    now = [0.0]

    async def close_at_once(listener: trio.SocketListener) -> None:
        while True:
            await (await listener.accept()).aclose()

    async def show_token(listener: trio.SocketListener) -> None:
        held = []
        while True:
            held.append(await listener.accept())
            await held[-1].send_all(RawHello(RAW_PUNCHED, bytes.fromhex(TOKEN)).encode())

    async def main() -> list[bool]:
        async with trio.open_nursery() as nursery:
            traversal = nated_node(await relay_port(nursery))
            traversal.state.view.links = SimpleNamespace(connections={})  # where _note writes
            traversal.clock = lambda: now[0]
            own = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            nursery.start_soon(hold_silently, own)  # our plane's listener, for the proven one
            port = own.socket.getsockname()[1]
            traversal.state.addrs = traversal.state.data_addrs = [f"/ip4/127.0.0.1/tcp/{port}"]
            await nursery.start(traversal.serve)
            accepted = [bool((await offer(traversal, "127.0.0.1:80"))["accept"])]
            silent = await attacker(nursery, close_at_once)
            for _ in range(2):
                accepted.append(bool((await offer(traversal, silent))["accept"]))
                await punches_in_ended(traversal)
            proving = await attacker(nursery, show_token)
            for _ in range(2):  # one that showed the token is no victim: not backed off
                accepted.append(bool((await offer(traversal, proving))["accept"]))
                await punches_in_ended(traversal)
            past = await attacker(nursery, close_at_once)
            accepted.append(bool((await offer(traversal, past))["accept"]))  # 4th: past 3
            now[0] = PUNCH_WINDOW_S
            accepted.append(bool((await offer(traversal, past))["accept"]))
            nursery.cancel_scope.cancel()
        return accepted

    assert run(main) == [False, True, False, True, True, False, True]
