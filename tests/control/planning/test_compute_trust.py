"""Issue 26.9: compute claims are floored at what the fastest device could do on the run's
model, and a peer whose steps run k times slower than its plan predicted is priced k times
slower."""

from __future__ import annotations

import dataclasses

import numpy as np

from p2ptrain.control.planning.compute import fastest_row_s, peer_compute
from p2ptrain.control.planning.trust import (
    CONTRADICTION_PLANS,
    JUDGE_AFTER_S,
    MAX_REPRICE,
    REPRICE_AFTER,
    ComputeTrust,
)
from p2ptrain.records import PeerMetrics, Plan, RunSpec, StageCompute

RUN = RunSpec().replace(stages=2, n_layer=4, preset="1.3b")


def claim(block_row_s: float) -> StageCompute:
    return StageCompute(block_row_s, 1e-6, block_row_s, 8, "cuda", RUN.run_id)


def test_no_claim_is_faster_than_the_fastest_device_on_the_run_s_model() -> None:
    floor_block, _, floor_head = fastest_row_s(RUN)
    assert floor_block > 1e-9  # a 1.3b block on 2048 tokens: far above the record's floor
    compute = peer_compute(["liar", "honest"], {"liar": claim(1e-9), "honest": claim(0.05)}, RUN)
    assert compute is not None
    assert compute.block_row_s.tolist() == [floor_block, 0.05]
    assert compute.head_row_s[0] == floor_head


def plan(predicted_step_s: float, epoch: int = 1) -> Plan:
    return Plan(
        term=1,
        epoch=epoch,
        planner="p0",
        stages=2,
        pipelines=(("p0", "p1"), ("p2", "p3")),
        spares=(),
        data_addrs={},
        cost_s=1.0,
        predicted_step_s=predicted_step_s,
    )


def steps(step_s: dict[str, float]) -> dict[str, PeerMetrics | None]:
    where = {"p0": (0, 0), "p1": (1, 0), "p2": (0, 1), "p3": (1, 1)}
    return {
        p: PeerMetrics(step=10, stage=where[p][0], replica=where[p][1], step_s=s)
        for p, s in step_s.items()
    }


def test_a_pipeline_that_runs_k_times_slower_than_predicted_is_re_priced_once() -> None:
    trust = ComputeTrust()
    current = plan(predicted_step_s=1.0)
    # p1 claimed fast and is 4x slower: the pipeline's members both step at its pace
    reported = steps({"p0": 4.0, "p1": 4.1, "p2": 1.1, "p3": 1.0})
    assert not trust.observe(current, reported, now=0.0)  # too soon: older plans' steps
    assert trust.observe(current, reported, now=JUDGE_AFTER_S)
    assert trust.factors == {"p0": 4.0, "p1": 4.0}  # the pipeline at fault, not p2-p3
    assert not trust.observe(current, reported, now=2 * JUDGE_AFTER_S)  # once per plan
    compute = peer_compute(
        ["p0", "p1", "p2"], {p: claim(0.01) for p in ("p0", "p1", "p2")}, RUN, trust.factors
    )
    assert compute is not None
    assert np.allclose(compute.block_row_s, [0.04, 0.04, 0.01])


def test_a_plan_that_runs_as_predicted_re_prices_no_one() -> None:
    trust = ComputeTrust()
    slack = REPRICE_AFTER * 0.9
    reported = steps({"p0": slack, "p1": 1.0, "p2": 1.0, "p3": slack})
    assert not trust.observe(plan(1.0), reported, now=0.0)
    assert not trust.observe(plan(1.0), reported, now=JUDGE_AFTER_S)
    assert trust.factors == {}
    # and a plan with a trainer that has not stepped yet is not judged
    assert not trust.observe(plan(1.0, epoch=2), steps({"p0": 9.0}), now=0.0)
    assert not trust.observe(plan(1.0, epoch=2), steps({"p0": 9.0}), now=JUDGE_AFTER_S)


def judged(
    trust: ComputeTrust,
    pipelines: tuple[tuple[str, ...], ...],
    step_s: dict[str, float],
    epoch: int,
) -> None:
    """One plan of `pipelines`, judged on `step_s` reported by each member at its place."""
    current = dataclasses.replace(plan(1.0, epoch), pipelines=pipelines, stages=len(pipelines[0]))
    reported = {
        peer: PeerMetrics(step=10, stage=stage, replica=replica, step_s=step_s[peer])
        for replica, pipeline in enumerate(pipelines)
        for stage, peer in enumerate(pipeline)
    }
    trust.observe(current, reported, now=0.0)
    trust.observe(current, reported, now=JUDGE_AFTER_S)


def test_a_member_reporting_slow_steps_frames_no_honest_mate_and_is_found_out() -> None:
    """The slowest report counted: one member reporting 1e9 s steps priced its honest mates
    1,000 times slower in every plan it shared with them."""
    trust = ComputeTrust()
    judged(trust, (("liar", "h1"), ("h2", "h3")), {"liar": 1e9, "h1": 1.0, "h2": 1.0, "h3": 1.0}, 1)
    assert trust.factors == {}  # its word against h1's: no one yet
    judged(trust, (("h1", "h2"), ("liar", "h3")), {"liar": 1e9, "h1": 1.0, "h2": 1.0, "h3": 1.0}, 2)
    assert trust.factors == {"liar": MAX_REPRICE}  # a second mate contradicted it: the liar
    judged(trust, (("h1", "liar", "h2"),), {"liar": 1e9, "h1": 1.0, "h2": 1.0}, 3)
    assert set(trust.factors) == {"liar"}  # where most members agree, their word stands


def test_a_slow_member_cannot_hide_its_pipelines_pace_for_long() -> None:
    trust = ComputeTrust()
    judged(trust, (("slow", "h1"), ("h2", "h3")), {"slow": 1.0, "h1": 4.0, "h2": 1.0, "h3": 1.0}, 1)
    assert trust.factors == {}
    judged(trust, (("h2", "slow"), ("h1", "h3")), {"slow": 1.0, "h2": 4.0, "h1": 1.0, "h3": 1.0}, 2)
    assert trust.factors == {"slow": 4.0}  # two mates saw its pace: it alone is re-priced
    trust = ComputeTrust()
    judged(trust, (("h1", "slow", "h2"),), {"slow": 1.0, "h1": 4.0, "h2": 4.0}, 1)
    assert trust.factors == {"h1": 4.0, "slow": 4.0, "h2": 4.0}  # most members' word: at once


def test_contradictions_long_apart_re_price_no_one() -> None:
    """An honest member contradicted by one liar, then by another many plans later, is not the
    liar: contradictions count within CONTRADICTION_PLANS judged plans (they were kept for
    good)."""
    trust = ComputeTrust()
    judged(trust, (("l1", "h1"), ("h2", "h3")), {"l1": 1e9, "h1": 1.0, "h2": 1.0, "h3": 1.0}, 1)
    for epoch in range(2, 2 + CONTRADICTION_PLANS):  # plans that run as predicted
        judged(
            trust, (("h1", "h2"), ("h3", "h4")), dict.fromkeys(("h1", "h2", "h3", "h4"), 1.0), epoch
        )
    epoch = 2 + CONTRADICTION_PLANS
    judged(trust, (("l2", "h1"), ("h2", "h3")), {"l2": 1e9, "h1": 1.0, "h2": 1.0, "h3": 1.0}, epoch)
    assert "h1" not in trust.factors
    assert len(trust.contradicted) <= 3  # what is remembered stays bounded
