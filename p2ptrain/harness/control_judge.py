"""How `bench control` judges a first plan (control_bench.py): the planner's matrix against the
ground truth (control_truth.py), pair by pair, and the plan made on it against the plan made on
the truth, both priced on the truth."""

from __future__ import annotations

from typing import Any

import numpy as np

from p2ptrain.control.estimate.matrix import EstimatedMatrices
from p2ptrain.harness.control_truth import Truth
from p2ptrain.schedule import Topology
from p2ptrain.schedule.cost import CostModel, plan_cost
from p2ptrain.schedule.planner import plan_swarm
from p2ptrain.schedule.synthetic import paper_workload

MAX_PAIRS = 200_000  # error statistics on a sample of pairs


def quantiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"median": float("nan"), "p90": float("nan")}
    return {
        "median": round(float(np.median(values)), 4),
        "p90": round(float(np.quantile(values, 0.9)), 4),
    }


def plan_cost_on(estimate: EstimatedMatrices, pipelines: list[list[int]], workload: Any) -> float:
    """Seconds a step of `pipelines` (positions in the matrix's peers) on these matrices."""
    m = estimate.matrices
    topology = Topology(list(m.peers), m.delay_ms, m.bandwidth_gbps, workload=workload)
    model = CostModel.build(topology, workload)
    return float(plan_cost(model, np.array(pipelines, dtype=np.intp)).cost_s)


def judge(
    truth: Truth,
    estimate: EstimatedMatrices,
    members: list[int],
    pipelines: list[list[int]],
    seed: int,
    stages: int,
    evaluations: int,
) -> dict[str, Any]:
    """Relative errors of the round trips and rates the planner planned on (median and 90th
    percentile, all pairs, and apart: measured or estimated pairs, two ends in the same city or
    not), and the plan's cost ratio against the truth's own plan."""
    true_rtt, true_rate = truth.matrices(members)
    m = estimate.matrices
    rng = np.random.default_rng(seed)
    i, j = np.triu_indices(len(members), k=1)
    if i.size > MAX_PAIRS:
        pick = rng.choice(i.size, MAX_PAIRS, replace=False)
        i, j = i[pick], j[pick]
    rtt_error = np.abs(2 * m.delay_ms[i, j] - true_rtt[i, j]) / true_rtt[i, j]
    rate_error = np.abs(1e3 * m.bandwidth_gbps[i, j] - true_rate[i, j]) / true_rate[i, j]
    city = np.array([truth.city[p] for p in members])
    same = city[i] == city[j]
    rtt_measured = estimate.rtt_measured[i, j]
    rate_measured = estimate.rate_measured[i, j]
    workload = paper_workload(stages, len(pipelines))
    truth_topology = Topology(list(m.peers), true_rtt / 2, true_rate / 1e3, workload=workload)
    on_truth = EstimatedMatrices(
        type(m)(list(m.peers), true_rtt / 2, true_rate / 1e3, 0),
        estimate.rtt_measured,
        estimate.rate_measured,
    )
    best = plan_swarm(
        truth_topology, stages, len(pipelines), seed=seed, max_evaluations=evaluations
    )
    ours = plan_cost_on(on_truth, pipelines, workload)
    return {
        "rtt_error": quantiles(rtt_error),
        "rate_error": quantiles(rate_error),
        "plan_cost_ratio": round(ours / best.cost_s, 4),
        "measured_links": round(float(estimate.measured_fraction), 4),
        "error_breakdown": {
            "rtt_measured": quantiles(rtt_error[rtt_measured]),
            "rtt_estimated": quantiles(rtt_error[~rtt_measured]),
            "rtt_same_city": quantiles(rtt_error[same]),
            "rtt_other_city": quantiles(rtt_error[~same]),
            "rate_measured": quantiles(rate_error[rate_measured]),
            "rate_estimated": quantiles(rate_error[~rate_measured]),
        },
    }
