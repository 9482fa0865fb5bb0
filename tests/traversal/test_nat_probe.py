"""The UDP address observer: a strict parser (random bytes give the one wire error), answers no
larger than queries, rate limits, a live round trip on loopback, and the NAT classification."""

from __future__ import annotations

import os
import random
import socket
from typing import Any

import pytest
import trio

from p2ptrain.errors import WireError
from p2ptrain.net.ratelimit import WindowLimiter
from p2ptrain.records.reachability import (
    UDP_DATAGRAM_BYTES,
    parse_udp_answer,
    parse_udp_query,
    udp_answer,
    udp_query,
)
from p2ptrain.traversal.nat_probe import (
    UDP_ANSWERS_PER_IP,
    answer_for,
    classify_nat,
    observe_from,
    serve_udp_observer,
)

NONCE = bytes(range(8))


def fresh_limiter() -> WindowLimiter:
    return WindowLimiter(UDP_ANSWERS_PER_IP, 512, 10.0)


def test_random_bytes_never_crash_the_parsers() -> None:
    rng = random.Random(7)
    query = udp_query(NONCE)
    inputs = [rng.randbytes(rng.randint(0, 80)) for _ in range(3000)]
    # valid queries with one byte changed: only a changed nonce byte keeps them valid
    for _ in range(3000):
        data = bytearray(query)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        inputs.append(bytes(data))
    num_valid = 0
    for data in inputs:
        for parse in (parse_udp_query, lambda d: parse_udp_answer(d, NONCE)):
            try:
                parse(data)
                num_valid += 1
            except WireError:
                pass
        answer = answer_for(data, ("192.0.2.1", 5000), fresh_limiter(), 0.0)
        assert answer is None or answer == udp_answer(parse_udp_query(data), "192.0.2.1", 5000)
    assert 0 < num_valid < len(inputs) // 2


def test_an_answer_is_no_larger_than_its_query_and_carries_the_source() -> None:
    query = udp_query(NONCE)
    answer = answer_for(query, ("198.51.100.4", 40123), fresh_limiter(), 0.0)
    assert answer is not None and len(answer) == len(query) == UDP_DATAGRAM_BYTES
    assert parse_udp_answer(answer, NONCE) == ("198.51.100.4", 40123)
    with pytest.raises(WireError, match="stale"):
        parse_udp_answer(answer, bytes(8))  # another query's answer
    assert answer_for(query + b"\x00", ("198.51.100.4", 1), fresh_limiter(), 0.0) is None
    assert answer_for(query, ("2001:db8::1", 1), fresh_limiter(), 0.0) is None  # IPv4 only


def test_answers_are_rate_limited_per_source_ip() -> None:
    limiter = fresh_limiter()
    query = udp_query(NONCE)
    answered = [answer_for(query, ("192.0.2.1", p), limiter, 1.0) for p in range(1, 40)]
    assert sum(a is not None for a in answered) == UDP_ANSWERS_PER_IP
    assert answer_for(query, ("192.0.2.2", 1), limiter, 1.0) is not None  # another source
    assert answer_for(b"garbage", ("192.0.2.3", 1), limiter, 1.0) is None
    assert limiter.num_refused == 39 - UDP_ANSWERS_PER_IP  # garbage costs no allowance


async def answers_to_junk(port: int) -> list[bytes]:
    """Whatever the observer on `port` sends back within 0.5 s of three malformed datagrams."""
    answers = []
    with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        await sock.bind(("127.0.0.1", 0))
        for junk in (b"x" * 31, udp_query(NONCE) + b"\x00", os.urandom(UDP_DATAGRAM_BYTES)):
            await sock.sendto(junk, ("127.0.0.1", port))
        with trio.move_on_after(0.5):
            while True:
                answers.append((await sock.recvfrom(64))[0])
    return answers


def test_a_live_observer_answers_queries_and_ignores_other_datagrams() -> None:
    async def main() -> tuple[int, list[Any], list[bytes]]:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_udp_observer, "127.0.0.1", 0)
            local_port, seen = await observe_from([("127.0.0.1", port)], "127.0.0.1")
            answers = await answers_to_junk(port)
            nursery.cancel_scope.cancel()
        return local_port, seen, answers

    local_port, seen, answers = trio.run(main)
    assert seen == [("127.0.0.1", local_port)]
    assert answers == []
    assert classify_nat(local_port, ["127.0.0.1"], seen)[0] == "none"


def test_a_taken_port_leaves_the_node_without_an_observer() -> None:
    async def main() -> Any:
        with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
            await taken.bind(("127.0.0.1", 0))
            async with trio.open_nursery() as nursery:
                return await nursery.start(serve_udp_observer, "127.0.0.1", taken.getsockname()[1])

    assert trio.run(main) is None


@pytest.mark.parametrize(
    ("observed", "nat_type"),
    [
        ([None, None], "unknown"),
        ([("10.77.0.2", 5000), ("10.77.0.2", 5000)], "none"),
        ([("10.77.0.2", 5000), None], "none"),
        ([("10.78.0.3", 41000), ("10.78.0.3", 41000)], "cone"),
        ([("10.78.0.3", 41000), ("10.78.0.3", 52000)], "symmetric"),
        ([("10.78.0.3", 41000), None], "unknown"),  # behind a NAT; its type unknown
        ([("10.77.0.2", 6000), ("10.77.0.2", 6000)], "cone"),  # our IP, another port: a NAT
    ],
)
def test_nat_types_from_what_servers_saw(observed: list[Any], nat_type: str) -> None:
    assert classify_nat(5000, ["10.77.0.2", "127.0.0.1"], observed)[0] == nat_type
