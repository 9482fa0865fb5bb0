"""bench e2e's bookkeeping without root: the random placements' mean, measured communication,
time to the target loss, the speedups, the table; and the traffic the step-time model is fed."""

from __future__ import annotations

from typing import Any

import pytest

from p2ptrain.harness.e2e_bench import (
    mean_of_runs,
    render,
    slow_peer_indices,
    summarize,
    worker_quotas,
    worker_shares,
)
from p2ptrain.harness.e2e_join import run_spec_for
from p2ptrain.records.run import RunSpec
from p2ptrain.schedule.workload import stage_parameter_counts, step_traffic


def _run(seed: int, tokens_per_s: float, step_s: float, predicted_s: float) -> dict[str, Any]:
    curve = [(step_s * (i + 1), 5.0 - 0.5 * i) for i in range(4)]
    return {
        "seed": seed,
        "tokens_per_s": tokens_per_s,
        "step_s": step_s,
        "predicted_s": predicted_s,
        "predicted_paper_s": predicted_s / 2,
        "pipelines": [[seed, seed + 1]],
        "curve": curve,
    }


def test_mean_of_random_runs_keeps_each_run_and_the_median_curve() -> None:
    runs = [
        _run(0, 100.0, 6.0, 4.0),
        _run(1, 200.0, 4.0, 3.0),
        {"error": "x", "tokens_per_s": None},
    ]
    runs.append(_run(2, 150.0, 5.0, 3.5))
    mean = mean_of_runs(runs)
    assert mean["tokens_per_s"] == pytest.approx(150.0)
    assert mean["step_s"] == pytest.approx(5.0)
    assert mean["predicted_s"] == pytest.approx(3.5)
    assert mean["median_seed"] == 2 and mean["curve"] == runs[3]["curve"]
    assert mean["runs"] == runs
    assert mean_of_runs([{"error": "boom", "tokens_per_s": None}])["error"] == "boom"


def test_summary_measures_communication_against_the_ideal_run() -> None:
    results = {
        "scheduled": _run(0, 300.0, 3.0, 2.2),
        "random": mean_of_runs([_run(0, 100.0, 6.0, 4.0), _run(1, 200.0, 4.0, 3.0)]),
        "hivemind_dp": {"tokens_per_s": 60.0, "step_s": 9.0, "curve": [(9.0, 5.0), (18.0, 4.4)]},
        "ideal": _run(0, 1000.0, 1.0, 0.0),
    }
    summary = summarize(results, target_loss=None)
    assert summary["scheduled"]["measured_s"] == pytest.approx(2.0)
    assert summary["scheduled"]["prediction_error"] == pytest.approx(0.1)
    assert [r["measured_s"] for r in summary["random"]["runs"]] == pytest.approx([5.0, 3.0])
    assert summary["random"]["measured_s"] == pytest.approx(4.0)
    assert summary["target_loss"] == pytest.approx(4.4)  # the worst final loss
    assert summary["scheduled"]["time_to_target_s"] == pytest.approx(9.0)  # 4.0 at step 3
    assert summary["hivemind_dp"]["time_to_target_s"] == pytest.approx(18.0)
    assert summary["speedup_scheduled_vs_random"] == pytest.approx(2.0)
    assert summary["speedup_scheduled_vs_hivemind_dp"] == pytest.approx(5.0)
    table = render(summary)
    for name in ("scheduled", "random (mean)", "random seed 1", "hivemind_dp", "ideal"):
        assert name in table
    assert "scheduled / random tokens/s: 2.00x" in table
    # without the stages' timings: the model's communication on the ideal run's compute
    assert summary["scheduled"]["predicted_step_s"] == pytest.approx(3.2)
    assert summary["scheduled"]["predicted_step_additive_s"] == pytest.approx(3.2)
    assert summary["scheduled"]["step_prediction_error"] == pytest.approx(3.2 / 3.0 - 1)
    assert "speedup_compute_aware_vs_blind" not in summary


def test_compute_blind_run_and_its_speedup() -> None:
    results = {
        "scheduled": _run(0, 300.0, 3.0, 2.2),
        "compute_blind": _run(0, 200.0, 4.5, 2.0),
        "ideal": _run(0, 1000.0, 1.0, 0.0),
        "slow_peers": {"1": 0.25, "3": 0.25},
    }
    summary = summarize(results, target_loss=None)
    assert summary["speedup_compute_aware_vs_blind"] == pytest.approx(1.5)
    assert summary["compute_blind"]["measured_s"] == pytest.approx(3.5)
    assert "compute-aware / compute-blind tokens/s: 1.50x" in render(summary)


def test_variants_set_the_run_spec_the_live_planner_reads() -> None:
    spec = RunSpec()
    assert run_spec_for(spec, "scheduled", 3).swarm.placement == "scheduled"
    random = run_spec_for(spec, "random", 3)
    assert (random.swarm.placement, random.swarm.placement_seed) == ("random", 3)
    blind = run_spec_for(spec, "compute_blind", 3)
    assert (blind.swarm.placement, blind.swarm.compute_aware) == ("scheduled", False)
    assert not run_spec_for(spec, "ideal", 3).swarm.compute_aware  # the run's own shape


def test_slow_peers_are_spread_and_spare_the_bootstraps_namespace() -> None:
    assert slow_peer_indices(8, 4) == [1, 3, 5, 7]
    assert slow_peer_indices(8, 0) == []
    assert slow_peer_indices(4, 1) == [3]
    assert slow_peer_indices(8, 8) == list(range(8))


def test_a_simulated_step_is_the_prediction_and_the_additive_one_is_kept() -> None:
    scheduled = {**_run(0, 300.0, 3.0, 2.2), "predicted_step_s": 2.7}
    summary = summarize({"scheduled": scheduled, "ideal": _run(0, 1000.0, 1.0, 0.0)}, None)
    assert summary["scheduled"]["predicted_step_s"] == pytest.approx(2.7)
    assert summary["scheduled"]["step_prediction_error"] == pytest.approx(2.7 / 3.0 - 1)
    assert summary["scheduled"]["predicted_step_additive_s"] == pytest.approx(3.2)


def test_workers_get_equal_shares_and_slow_ones_a_fraction() -> None:
    share = worker_shares(8, cores=2)
    assert share == pytest.approx(0.1875)  # three quarters of two cores, among eight
    quotas = worker_quotas(8, share, 4, 4.0)
    assert quotas == {i: share / 4 if i in (1, 3, 5, 7) else share for i in range(8)}
    assert worker_quotas(8, share) == {i: share for i in range(8)}
    assert worker_quotas(8, 0.0, 4, 4.0) == {}  # --worker-cores 0: unlimited


def test_a_failed_run_is_reported_not_fatal() -> None:
    results = {"scheduled": _run(0, 300.0, 3.0, 2.2), "hivemind_dp": {"error": "worker 3 died"}}
    summary = summarize(results, target_loss=4.0)
    assert summary["speedup_scheduled_vs_hivemind_dp"] is None
    assert "hivemind_dp" in render(summary) and "worker 3 died" in render(summary)


def test_step_traffic_of_the_default_run() -> None:
    spec = RunSpec().replace(
        stages=4, n_layer=4, n_embd=128, block_size=64, batch_size=16, micro_batches=2
    )
    traffic = step_traffic(spec, stages=4, replicas=2)
    counts = stage_parameter_counts(spec, 4)
    assert traffic.stage_gradient_bytes == tuple(2.0 * c for c in counts)  # fp16 on the wire
    assert traffic.activation_bytes == 4 * 64 * 128 * 2  # 8 rows per replica, 2 micro-batches
    assert traffic.micro_batches == 2
    # uneven rows: 3 replicas of 16 rows -> 6, 5, 5; the largest micro-batch has 3 rows
    assert step_traffic(spec, 4, 3).activation_bytes == 3 * 64 * 128 * 2
