"""How fast a peer, and all strangers together, may open inbound streams (net/ratelimit.py):
a loop of requests is refused past its burst while others are still answered."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from p2ptrain.net import rpc
from p2ptrain.net.host import make_host
from p2ptrain.net.ratelimit import MAX_TRACKED_PEERS, StreamRates
from tests.net.test_inbound_share import HELLO, LISTEN, hello, hosts_connected_to
from tests.net.trio_run import run


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_gets_its_burst_then_its_rate_and_others_are_not_charged() -> None:
    clock = Clock()
    rates = StreamRates(rate_per_s=2, burst=5, strangers_rate_per_s=100, clock=clock)
    assert [rates.allows("a", False) for _ in range(7)] == [True] * 5 + [False] * 2
    assert rates.allows("b", False)  # a's loop costs b nothing
    clock.now = 1.0  # two more tokens a second
    assert [rates.allows("a", False) for _ in range(3)] == [True, True, False]


def test_strangers_share_one_rate_and_a_refused_peer_spends_none_of_it() -> None:
    clock = Clock()
    rates = StreamRates(
        rate_per_s=1, burst=2, strangers_rate_per_s=1, strangers_burst=4, clock=clock
    )
    assert [rates.allows("flooder", True) for _ in range(10)] == [True] * 2 + [False] * 8
    assert [rates.allows(f"s{i}", True) for i in range(3)] == [True, True, False]
    assert rates.allows("member", False)  # members are not held to the strangers' share


def test_throwaway_identities_keep_at_most_the_tracked_buckets() -> None:
    clock = Clock()
    rates = StreamRates(strangers_burst=1e9, clock=clock)
    for i in range(3 * MAX_TRACKED_PEERS):
        rates.allows(f"p{i}", True)
    assert len(rates._peers) <= MAX_TRACKED_PEERS


def test_a_peer_opening_streams_in_a_loop_is_refused_and_a_member_still_answered() -> None:
    """Live hosts: a stranger asking in a loop (each stream answered and closed, so no cap on
    open streams holds it back) is refused past its burst; a member is answered meanwhile."""
    members: set[str] = set()
    limits = rpc.InboundLimits(
        is_member=members.__contains__, rates=StreamRates(burst=5, rate_per_s=0.1)
    )

    async def scenario() -> tuple[list[bool], Any]:
        server = make_host(os.urandom(32))
        async with server.run(listen_addrs=LISTEN):
            server.set_stream_handler(HELLO, limits.guard(rpc.make_handler(hello)))
            async with hosts_connected_to(server, 2) as (member, stranger):
                members.add(member.get_id().to_base58())
                answered = []
                for _ in range(8):
                    reply = None
                    with contextlib.suppress(Exception):
                        reply = await rpc.call(stranger, server.get_id(), HELLO)
                    answered.append(reply == {"hello": True})
                return answered, await rpc.call(member, server.get_id(), HELLO)

    answered, member_reply = run(scenario)
    assert answered == [True] * 5 + [False] * 3
    assert member_reply == {"hello": True}
    assert limits.num_refused == 3
