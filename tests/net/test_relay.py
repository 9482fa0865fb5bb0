"""The relay's raw port and bookkeeping (net/relay.py) on loopback, with real sockets: observed
endpoints, circuits spliced with their bytes counted, and the limits. Hole punches need NATs (on
loopback a SYN meets a reset, not a NAT that drops it): tests/integration/test_local_emulate.py."""

from __future__ import annotations

import os
import random

import pytest
import trio

from p2ptrain.errors import WireError
from p2ptrain.net import relay
from p2ptrain.records.relay import RAW_CIRCUIT, RAW_HELLO_BYTES, RawHello, RelayRequest
from tests.net.trio_run import run

A, B, C = "peer-a", "peer-b", "peer-c"


def server(members: tuple[str, ...] = (A, B)) -> relay.RelayServer:
    return relay.RelayServer(lambda peer: peer in members)


async def serving(nursery: trio.Nursery, relay_server: relay.RelayServer) -> tuple[str, int]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(relay_server.serve_raw, listeners[0])
    return "127.0.0.1", int(listeners[0].socket.getsockname()[1])


def test_the_raw_port_tells_a_client_its_endpoint() -> None:
    async def main() -> tuple[str, int]:
        async with trio.open_nursery() as nursery:
            address = await serving(nursery, server())
            result = await relay.observe(address)
            nursery.cancel_scope.cancel()
        return result

    seen, port = run(main)
    assert seen == f"127.0.0.1:{port}"


def test_a_granted_circuit_splices_both_halves_and_counts_the_bytes() -> None:
    relay_server = server()
    now = 0.0

    async def main() -> tuple[bytes, bytes]:
        assert relay_server.reserve(B, now) == ""
        error, token = relay_server.grant(A, B, now)
        assert error == "" and len(token) == 16
        async with trio.open_nursery() as nursery:
            address = await serving(nursery, relay_server)
            a = await relay.open_raw(address, RAW_CIRCUIT, token)
            b = await relay.open_raw(address, RAW_CIRCUIT, token)
            await a.send_all(b"hello from a")
            got_b = await relay.receive_exact(b, 12)
            await b.send_all(b"and back" * 1000)
            got_a = await relay.receive_exact(a, 8000)
            await a.aclose()
            await b.aclose()
            nursery.cancel_scope.cancel()
        return got_b, got_a

    got_b, got_a = run(main)
    assert got_b == b"hello from a" and got_a == b"and back" * 1000
    assert relay_server.counters.bytes_relayed == 12 + 8000
    assert relay_server.counters.circuits == 1 and relay_server.counters.active == 0
    assert relay_server.pending == {}


def test_a_wrong_token_gets_no_circuit() -> None:
    relay_server = server()

    async def main() -> bytes:
        relay_server.reserve(B, 0.0)
        async with trio.open_nursery() as nursery:
            address = await serving(nursery, relay_server)
            stream = await relay.open_raw(address, RAW_CIRCUIT, os.urandom(16))
            with trio.fail_after(5):
                data = await stream.receive_some(10)
            nursery.cancel_scope.cancel()
        return data

    assert run(main) == b""  # closed at once


def test_reservations_and_grants_follow_the_limits() -> None:
    relay_server = server(members=(A, B))
    assert relay_server.reserve(C, 0.0) == "not a member of this run"
    assert relay_server.grant(A, B, 0.0)[0] == "no reservation here"
    assert relay_server.reserve(B, 0.0) == ""
    assert relay_server.grant(C, B, 0.0)[0] == "not a member of this run"
    # the slot lapses unless renewed
    assert relay_server.grant(A, B, relay.RESERVATION_TTL_S + 1)[0] == "no reservation here"
    assert relay_server.reserve(B, 200.0) == ""
    grants = [relay_server.grant(A, B, 200.0)[0] for _ in range(relay.MAX_CIRCUITS_PER_PEER + 1)]
    assert grants[:-1] == [""] * relay.MAX_CIRCUITS_PER_PEER
    assert grants[-1].startswith("at most")
    # ungranted circuits expire, and so free their places
    assert relay_server.grant(A, B, 200.0 + relay.CIRCUIT_PAIRING_S + 1)[0] == ""
    assert relay_server.counters.refused == 1


def test_a_full_relay_refuses_new_reservations() -> None:
    peers = [f"p{i}" for i in range(relay.MAX_RESERVATIONS + 1)]
    relay_server = relay.RelayServer(lambda peer: True)
    answers = [relay_server.reserve(peer, 0.0) for peer in peers]
    assert answers[:-1] == [""] * relay.MAX_RESERVATIONS
    assert answers[-1].startswith("relay full")
    assert relay_server.reserve(peers[0], 1.0) == ""  # a renewal is not a new slot


def test_raw_hellos_decode_or_raise_the_wire_error() -> None:
    rng = random.Random(3)
    decoded = 0
    for _ in range(20_000):
        data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 16, 17, 17, 18])))
        try:
            hello = RawHello.decode(data)
        except WireError:
            continue
        decoded += 1
        assert len(hello.token) == 16 and RawHello.decode(hello.encode()) == hello
    assert decoded > 0
    assert len(RawHello(RAW_CIRCUIT, bytes(16)).encode()) == RAW_HELLO_BYTES


def test_a_relay_request_names_a_target_only_to_connect() -> None:
    with pytest.raises(WireError):
        RelayRequest.from_dict({"op": "reserve", "target": "12D3KooWxyz"})
    with pytest.raises(WireError):
        RelayRequest.from_dict({"op": "connect"})
    with pytest.raises(WireError):
        RelayRequest.from_dict({"op": "connect", "target": "x", "endpoint": "999.1.1.1:5"})
