"""The averaging timeouts follow the network the plan was made for (worker/averaging/round_timeouts.py)."""

from __future__ import annotations

import pytest

from p2ptrain.records import LinkFacts, NetworkFacts
from p2ptrain.worker.averaging.round_timeouts import (
    LOCAL_TIMEOUTS,
    MAX_LINGER_S,
    AveragingTimeouts,
    averaging_timeouts,
)


def test_a_plan_without_network_facts_keeps_the_short_local_timeouts() -> None:
    assert averaging_timeouts(10**6, None) == LOCAL_TIMEOUTS
    assert LOCAL_TIMEOUTS.request_s < LOCAL_TIMEOUTS.min_matchmaking_s


def test_wan_timeouts_cover_round_trips_and_the_gradient_transfer() -> None:
    # 446 ms round trip, 7.2 Mbit/s, 478 kB of gradient
    t = AveragingTimeouts.for_network(0.446, 7.2, 478_464)
    transfer_s = 2 * 478_464 * 8 / 7.2e6
    assert t.request_s == pytest.approx(4 * 0.446)  # a fresh connection + the answer
    assert t.min_matchmaking_s > t.request_s  # hivemind wants request < matchmaking
    assert t.sender_s >= 4 * 0.446 + transfer_s
    assert t.reducer_s >= t.sender_s and t.allreduce_s >= 4 * transfer_s
    assert 0 < t.linger_s <= MAX_LINGER_S


def test_the_plan_states_the_network() -> None:
    network = NetworkFacts(max_rtt_s=0.3, min_rate_mbps=10.0)
    assert averaging_timeouts(1000, network) == AveragingTimeouts.for_network(0.3, 10.0, 1000)


def test_slow_links_stretch_the_all_reduce_timeouts() -> None:
    fast = AveragingTimeouts.for_network(0.4, 100.0, 50_000_000)
    slow = AveragingTimeouts.for_network(0.4, 5.0, 50_000_000)
    assert slow.sender_s > fast.sender_s and slow.allreduce_s > fast.allreduce_s
    assert slow.linger_s == MAX_LINGER_S


def test_a_stage_s_rounds_are_timed_for_its_own_group_s_links() -> None:
    network = NetworkFacts(
        max_rtt_s=0.4,
        min_rate_mbps=5.0,
        groups=(LinkFacts(0.002, 1000.0), LinkFacts(0.3, 10.0)),
        hops=((LinkFacts(0.4, 5.0),),),
    )
    assert averaging_timeouts(1000, network, 0) == AveragingTimeouts.for_network(
        0.002, 1000.0, 1000
    )
    assert averaging_timeouts(1000, network, 1) == AveragingTimeouts.for_network(0.3, 10.0, 1000)
    # no stage, or an older plan without per-group facts: the swarm-wide pair
    assert averaging_timeouts(1000, network) == AveragingTimeouts.for_network(0.4, 5.0, 1000)
    older = NetworkFacts(max_rtt_s=0.4, min_rate_mbps=5.0)
    assert averaging_timeouts(1000, older, 1) == AveragingTimeouts.for_network(0.4, 5.0, 1000)
