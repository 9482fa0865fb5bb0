"""Issue 26.3: whatever link reports the planner sees, the plan it publishes decodes everywhere
(a plan receivers refuse as malformed gets its honest planner blamed and blocked)."""

from __future__ import annotations

import logging
import math

import pytest
import trio

from p2ptrain.control import wire
from p2ptrain.control.links import Link
from p2ptrain.control.planning import placement, planner
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.records import LinkFacts, Plan, RunSpec
from p2ptrain.records.network import MAX_RTT_S, MIN_RATE_MBPS
from tests.control.test_view import A, B, C, make_view

SEED = bytes(range(1, 33))


def _report(rtt_ms: float, mbps: float) -> dict[str, float]:
    return {"rtt_ms": rtt_ms, "rtt_age_s": 0.5, "bandwidth_mbps": mbps, "bandwidth_age_s": 0.5}


@pytest.mark.parametrize(
    ("rtt_ms", "mbps"),
    [(20.0, 0.0001), (20.0, 1e-12), (20.0, 0.0), (1e300, 50.0), (1e300, 5e-324), (0.0, 1e300)],
)
def test_a_pessimistic_link_report_still_gives_a_plan_every_receiver_decodes(
    rtt_ms: float, mbps: float
) -> None:
    """Every link of a 3-peer swarm reported at an extreme: the one pipeline must use them."""
    v, feed = make_view(me=A, peers=(B, C))
    v.run = RunSpec().replace(stages=3, n_layer=3, min_peers=3, compute_aware=False)
    rows = {B: {A: _report(rtt_ms, mbps), C: _report(rtt_ms, mbps)}, C: {A: _report(rtt_ms, mbps)}}

    maker = PlanMaker(v, A)

    async def ticks() -> list[bool]:
        outcomes = []
        for now in (1.0, 1.0 + PLAN_DEBOUNCE_S + 0.1):
            for author, row in rows.items():
                assert v.accept(feed("telemetry", author, {"links": row}), now) is None
            outcomes.append(await maker.tick(now, []))
        return outcomes

    v.claim()
    assert trio.run(ticks) == [False, True]
    assert v.plan is not None and v.plan.network is not None
    received = wire.decode(wire.encode(SEED, 1, v.plan)).body  # what every receiver runs
    assert isinstance(received, Plan) and received.network == v.plan.network
    network = received.network
    assert network is not None
    for facts in (network.swarm, *network.groups, *(h for row in network.hops for h in row)):
        assert 0 <= facts.rtt_s <= MAX_RTT_S and facts.rate_mbps >= MIN_RATE_MBPS
    if 0 < mbps < 1:  # a crawling link is stated as crawling, not as 0 nor as the median
        assert network.min_rate_mbps <= max(mbps, MIN_RATE_MBPS) * 1.01 + 1e-3


def test_network_facts_cover_only_the_pairs_the_plan_uses() -> None:
    """p0-p3 (not a group, not a hop) reported at 1e-12 Mbit/s and a 1e9 ms round trip: it
    stretches no timeout of a plan whose frames and averages never cross it."""
    peers = ["p0", "p1", "p2", "p3"]
    links = {(a, b): Link(10.0, 100.0, 0.0) for i, a in enumerate(peers) for b in peers[i + 1 :]}
    links[("p0", "p3")] = Link(1e9, 1e-12, 0.0)
    matrices = planner.build_matrices(peers, links)
    facts = planner.network_facts(matrices, [["p0", "p1"], ["p2", "p3"]])
    assert facts is not None
    assert facts.swarm == LinkFacts(0.01, 100.0)
    assert facts.groups == (LinkFacts(0.01, 100.0),) * 2


def test_a_plan_that_cannot_round_trip_is_logged_and_not_published(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plan = Plan(
        term=1,
        epoch=1,
        planner=A,
        stages=1,
        pipelines=((A,), (B,)),
        spares=(),
        data_addrs={},
        cost_s=math.nan,
    )
    with caplog.at_level(logging.ERROR):
        assert placement.publishable(plan) is None
    assert "BUG" in caplog.text
    huge = plan.replace(cost_s=math.inf, predicted_step_s=-1.0)
    checked = placement.publishable(huge)
    assert checked is not None and checked.cost_s == placement.MAX_PLAN_COST_S
    assert checked.predicted_step_s == 0.0
