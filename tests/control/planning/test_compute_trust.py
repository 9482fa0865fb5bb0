"""Issue 26.9: compute claims are floored at what the fastest device could do on the run's
model, and a peer whose steps run k times slower than its plan predicted is priced k times
slower."""

from __future__ import annotations

import numpy as np

from p2ptrain.control.planning.compute import fastest_row_s, peer_compute
from p2ptrain.control.planning.trust import JUDGE_AFTER_S, REPRICE_AFTER, ComputeTrust
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
    # p1 claimed fast and is 4x slower; it reports a fast step itself, its neighbour cannot
    reported = steps({"p0": 4.0, "p1": 1.0, "p2": 1.1, "p3": 1.0})
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
