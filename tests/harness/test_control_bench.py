"""`bench control` at a small size: the JSON fields the issue asks for, and its bounds."""

from __future__ import annotations

import pytest

from p2ptrain.harness import control_bench
from p2ptrain.harness.control_bench_report import render


def test_control_bench_at_30_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control_bench, "SEARCH_EVALUATIONS", 300)  # seconds, not minutes
    result = control_bench.run_benchmark([30], seed=0, horizon_s=200.0)
    (run,) = result["runs"]
    assert run["peers"] == 30
    assert set(run["bytes_per_node_s"]) == {"median", "max"}
    assert 0 < run["bytes_per_node_s"]["median"] <= 20_000
    assert run["first_plan_s"] is not None and run["first_plan_s"] <= 120.0
    # issue 29's bars for the round trips the planner planned on (this run: 0.04 / 0.20; the
    # search's CPU time moves the simulated clock, so a loaded box varies it a little)
    assert 0 <= run["rtt_error"]["median"] <= 0.15 and run["rtt_error"]["p90"] <= 0.4
    assert set(run["error_breakdown"]) >= {"rtt_measured", "rtt_estimated", "rtt_same_city"}
    assert set(run["rate_error"]) == {"median", "p90"}
    assert run["plan_cost_ratio"] is not None and run["plan_cost_ratio"] > 0
    assert run["failover_s"] is not None and run["failover_s"] <= 15.0
    assert run["neighbours_max"] <= 12  # bounded: 4 near, 4 random, 4 partners
    by_kind = run["bytes_per_node_s_by_kind"]
    assert {"plan", "telemetry", "probe", "peer"} <= set(by_kind)
    # the kinds split the whole: their medians add up to about the total's median
    assert 0.5 * run["bytes_per_node_s"]["median"] <= sum(by_kind.values())
    assert render(result).splitlines()[1].startswith("   30")


def test_confirming_commits_the_cheapest_plan_tried_not_the_latest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Plan A's links measure dearer than estimated, so B is searched; B's measure dearer
    still, and the rounds are spent: A, priced on every link measured, is the one committed
    (the bench committed B, the latest: 2x the truth's plan cost in a 100-peer run)."""
    monkeypatch.setattr(control_bench, "MAX_CONFIRM_ROUNDS", 2)
    bench = control_bench.ControlBench(20, seed=0)
    plan_a, plan_b = [[0, 1]], [[1, 0]]
    estimates = ["estimated", "confirmed once", "confirmed twice"]
    costs = {  # (pipelines, estimate) -> seconds a step
        ("A", "estimated"): 1.0,
        ("A", "confirmed once"): 2.0,
        ("A", "confirmed twice"): 2.0,
        ("B", "confirmed once"): 1.0,
        ("B", "confirmed twice"): 3.0,
    }
    committed: list[list[list[int]]] = []
    monkeypatch.setattr(control_bench, "plan_links", lambda pipelines: set())
    monkeypatch.setattr(
        control_bench,
        "with_measured",
        lambda peers, est, members, links: estimates[estimates.index(est) + 1],
    )
    monkeypatch.setattr(
        bench,
        "_cost",
        lambda est, pipelines, workload: costs[("A" if pipelines == plan_a else "B", est)],
    )
    monkeypatch.setattr(bench, "_search", lambda est, replicas: (plan_b, 0.0))
    monkeypatch.setattr(bench.sim, "at", lambda when, action: action())
    monkeypatch.setattr(bench, "_commit", lambda peer, members, pipes: committed.append(pipes))
    bench._confirm(bench.sim.peers[0], [0, 1], "estimated", plan_a)  # type: ignore[arg-type]
    assert bench.state.replanned == 1
    assert committed == [plan_a]
