"""The relay's raw port and bookkeeping (traversal/relay.py) on loopback, with real sockets: observed
endpoints, circuits spliced with their bytes counted, and the limits. Hole punches need NATs (on
loopback a SYN meets a reset, not a NAT that drops it): tests/integration/test_local_emulate.py."""

from __future__ import annotations

import logging
import os
import random

import pytest
import trio

from p2ptrain.errors import WireError
from p2ptrain.records.relay import RAW_CIRCUIT, RAW_HELLO_BYTES, RawHello, RelayRequest
from p2ptrain.traversal import relay
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
    grants = [relay_server.grant(A, B, 200.0)[0] for _ in range(relay.MAX_CIRCUITS_PER_PAIR + 1)]
    assert grants[:-1] == [""] * relay.MAX_CIRCUITS_PER_PAIR
    assert grants[-1].startswith("at most")
    # ungranted circuits expire, and so free their places
    assert relay_server.grant(A, B, 200.0 + relay.CIRCUIT_PAIRING_S + 1)[0] == ""
    assert relay_server.counters.refused == 1


def test_a_flood_of_refused_requests_logs_one_line_in_a_hundred(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay_server = server()
    assert relay_server.reserve(B, 0.0) == ""
    with caplog.at_level(logging.WARNING, logger=relay.__name__):
        for _ in range(relay.MAX_CIRCUITS_PER_PAIR + 250):
            relay_server.grant(A, B, 0.0)
    lines = [r.getMessage() for r in caplog.records if "relay refused" in r.getMessage()]
    assert relay_server.counters.refused == 250
    assert len(lines) == 3 and lines[-1].endswith(" per pair (201 so far)")


def test_no_source_cuts_a_target_off_and_nobody_relays_to_itself() -> None:
    """Finding 11 of issue 26: 48 pending grants from one source used to fill the target's
    share, and nobody else could reach it; a peer could ask for a circuit to itself."""
    everyone = [f"p{i}" for i in range(10)]
    relay_server = relay.RelayServer(lambda peer: True)
    assert relay_server.reserve(B, 0.0) == ""
    assert relay_server.grant(B, B, 0.0)[0] == "no circuit to oneself"
    hostile = [relay_server.grant(A, B, 0.0)[0] for _ in range(relay.MAX_CIRCUITS_PER_PEER)]
    assert hostile.count("") == relay.MAX_CIRCUITS_PER_PAIR
    assert relay_server.grant(C, B, 0.0)[0] == ""  # an honest peer still gets through
    # a source's own grants, over every target it asks for, stop at its share
    for peer in everyone:
        assert relay_server.reserve(peer, 0.0) == ""
    answers = [relay_server.grant(C, peer, 0.0)[0] for peer in everyone for _ in range(8)]
    assert answers.count("") == relay.MAX_CIRCUITS_PER_PEER - 1
    assert answers[-1] == f"at most {relay.MAX_CIRCUITS_PER_PEER} circuits per peer"


def test_slots_are_shared_out_by_address_prefix_and_identity_age() -> None:
    """Finding 11 of issue 26: Sybils (free identities from one network) held all 64 slots."""
    relay_server = relay.RelayServer(lambda peer: True)
    # one public /24 holds MAX_RESERVATIONS_PER_PREFIX slots; another /24 is another site
    site = [relay_server.reserve(f"s{i}", 0.0, f"81.2.69.{i + 1}") for i in range(10)]
    assert site.count("") == relay.MAX_RESERVATIONS_PER_PREFIX
    assert site[-1] == "at most 8 slots per 81.2.69.0/24"
    assert relay_server.reserve("elsewhere", 0.0, "81.2.70.1") == ""
    # a testbed or LAN shares one private prefix: no per-prefix quota there
    assert all(relay_server.reserve(f"lan{i}", 0.0, "10.77.0.9") == "" for i in range(10))
    # identities first seen after the relay's start-up share MAX_NEW_RESERVATIONS slots
    later = relay.NEW_IDENTITY_S + 1
    fresh = [relay_server.reserve(f"new{i}", later, f"9.9.{i}.1") for i in range(20)]
    assert fresh.count("") == relay.MAX_NEW_RESERVATIONS
    assert fresh[-1].endswith("slots for new identities")
    relay_server.first_seen["old"] = 0.0  # a peer this relay has known since its start
    assert relay_server.reserve("old", later, "9.9.99.1") == ""
    # once old enough, an identity is no longer new
    assert relay_server.reserve("new19", later + relay.NEW_IDENTITY_S, "9.9.19.1") == ""


def test_a_punch_endpoint_is_forwarded_only_as_the_relay_observed_it() -> None:
    """Finding 4 of issue 26: a requester named any IPv4:port and the target SYNed it."""
    relay_server = server()

    async def main() -> tuple[str, str, str, str]:
        async with trio.open_nursery() as nursery:
            address = await serving(nursery, relay_server)
            seen, port = await relay.observe(address)
            now = trio.current_time()
            nursery.cancel_scope.cancel()
        return (
            relay_server.vouch("127.0.0.1", f"8.8.8.8:{port}", now),  # the IP is replaced
            relay_server.vouch("127.0.0.1", f"127.0.0.1:{port + 1}", now),  # never observed
            relay_server.vouch("10.0.0.5", seen, now),  # observed from another address
            relay_server.vouch("127.0.0.1", seen, now + relay.OBSERVED_TTL_S + 1),  # too old
        )

    vouched, other_port, other_ip, stale = run(main)
    assert vouched.startswith("127.0.0.1:") and other_port == other_ip == stale == ""


def test_a_stranger_observing_from_fresh_ports_evicts_only_its_own_entries() -> None:
    """Observes from a stranger's fresh source ports filled the table (MAX_OBSERVED entries,
    each scanned on every observe), evicting members' observations; now a source address keeps
    its last MAX_OBSERVED_PORTS ports, and a full table forgets the least recent address."""
    relay_server = server()
    relay_server._note_observed("203.0.113.7", 40001, 0.0)  # a member, about to punch
    for port in range(10_000, 10_000 + relay.MAX_OBSERVED + 100):
        relay_server._note_observed("198.51.100.9", port, 1.0)
    assert relay_server.vouch("203.0.113.7", "203.0.113.7:40001", 2.0) == "203.0.113.7:40001"
    ports = relay_server.observed["198.51.100.9"]
    assert len(ports) == relay.MAX_OBSERVED_PORTS and len(relay_server.observed) == 2
    last = 10_000 + relay.MAX_OBSERVED + 99
    assert relay_server.vouch("198.51.100.9", f"198.51.100.9:{last}", 2.0)
    for number in range(relay.MAX_OBSERVED):  # as many addresses: the least recent goes first
        relay_server._note_observed(f"10.{number // 256}.{number % 256}.1", 1, 3.0)
    assert len(relay_server.observed) == relay.MAX_OBSERVED
    assert "203.0.113.7" not in relay_server.observed


def test_an_idle_circuit_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 11 of issue 26: a spliced circuit lived forever, bytes or not."""
    monkeypatch.setattr(relay, "CIRCUIT_IDLE_S", 0.5)
    relay_server = server()

    async def main() -> tuple[bytes, float]:
        relay_server.reserve(B, 0.0)
        _, token = relay_server.grant(A, B, 0.0)
        async with trio.open_nursery() as nursery:
            address = await serving(nursery, relay_server)
            a = await relay.open_raw(address, RAW_CIRCUIT, token)
            b = await relay.open_raw(address, RAW_CIRCUIT, token)
            await a.send_all(b"x")
            assert await relay.receive_exact(b, 1) == b"x"
            started = trio.current_time()
            with trio.fail_after(5):
                data = await b.receive_some(10)  # nothing more: the relay closes the circuit
            nursery.cancel_scope.cancel()
        return data, trio.current_time() - started

    data, waited_s = run(main)
    assert data == b"" and 0.25 < waited_s < 3  # not at once; the idle timer began at the forward
    assert relay_server.counters.active == 0 and relay_server.spliced == []


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
