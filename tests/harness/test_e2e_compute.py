"""bench e2e's stage timings: read from workers' metrics logs (metrics and, from a profiling
worker, step profiles), into the simulation's grid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.harness.e2e_compute import compute_summary, measured_compute, steady_step_s
from p2ptrain.records import MetricsReport, StepProfile

PLAN = (1, 2)


def metrics(step: int, key: tuple[int, int] = PLAN, **fields: Any) -> str:
    """A step's metrics line (forward_s, backward_s, update_s, ... in `fields`)."""
    report = MetricsReport(
        step=step,
        loss=None,
        tokens_per_s=1.0,
        stage=0,
        replica=0,
        samples=1,
        averaging="solo",
        step_s=fields.pop("step_s", 1.0),
        epoch=key[1],
        term=key[0],
        num_replicas=1,
        **fields,
    )
    return json.dumps(report.to_dict())


def profile(step: int, key: tuple[int, int] = PLAN, **fields: Any) -> str:
    """A step's profile line (the thread's CPU defaults to 0, the tree's to unknown)."""
    thread = {"forward_cpu_s": 0.0, "backward_cpu_s": 0.0, "update_cpu_s": 0.0, "frames": 0}
    report = StepProfile(
        step=step, term=key[0], epoch=key[1], stage=0, replica=0, **(thread | fields)
    )
    return json.dumps(report.to_dict())


def write_log(
    path: Path, steps: list[tuple[float, float, float]], key: tuple[int, int] = PLAN
) -> None:
    lines = [json.dumps({"type": "session", "plan": {}})]
    for i, (forward, backward, update) in enumerate(steps):
        lines.append(
            metrics(
                i, key, forward_s=forward, backward_s=backward, update_s=update, averaging_s=0.5 + i
            )
        )
    path.write_text("\n".join(lines) + "\nnot json\n")


def test_medians_per_stage_leave_out_the_first_step(tmp_path: Path) -> None:
    logs = [tmp_path / f"m{i}.jsonl" for i in range(3)]
    write_log(logs[0], [(9.0, 9.0, 9.0), (0.2, 0.4, 0.01), (0.4, 0.8, 0.03), (0.3, 0.6, 0.02)])
    write_log(logs[1], [(1.0, 2.0, 0.1)] * 3)
    write_log(logs[2], [(5.0, 5.0, 5.0)] * 3, key=(1, 1))  # another plan's steps only
    compute = measured_compute(logs, PLAN, [[0, 1]], micro_batches=2)
    assert compute is not None
    assert compute.forward_s == [[pytest.approx(0.15), pytest.approx(0.5)]]  # per micro-batch
    assert compute.backward_s == [[pytest.approx(0.3), pytest.approx(1.0)]]
    assert compute.update_s == [[pytest.approx(0.02), pytest.approx(0.1)]]
    summary = compute_summary(logs, PLAN, [[0, 1]])
    assert summary["averaging_s"] == [[2.5, 2.0]]
    # a stage that did not time its passes under this plan: no simulation
    assert measured_compute(logs, PLAN, [[0, 2]], micro_batches=2) is None
    assert compute_summary(logs, PLAN, [[2]])["forward_s"] == [[None]]


def test_the_steady_step_is_the_median_of_the_placed_workers_own_steps(tmp_path: Path) -> None:
    logs = [tmp_path / f"m{i}.jsonl" for i in range(3)]
    for path, periods in zip(
        logs, ([9.0, 1.0, 1.2, 1.1], [5.0, 0.9, 0.8, 3.0], [7.0, 7.0]), strict=True
    ):
        path.write_text(
            "\n".join(
                metrics(i, forward_s=0.1, backward_s=0.2, update_s=0.0, step_s=s)
                for i, s in enumerate(periods)
            )
            + "\n"
        )
    # worker 0: median of 1.0, 1.2, 1.1 = 1.1; worker 1: of 0.9, 0.8, 3.0 = 0.9; worker 2 unplaced
    assert steady_step_s(logs, PLAN, [[0, 1]]) == pytest.approx(1.0)
    assert compute_summary(logs, PLAN, [[0, 1]])["step_s"] == [[1.1, 0.9]]
    assert steady_step_s(logs, (9, 9), [[0, 1]]) is None


def test_cpu_seconds_and_the_testbed_quota_go_to_the_simulation(tmp_path: Path) -> None:
    logs = [tmp_path / f"m{i}.jsonl" for i in range(2)]
    for path, profiled in zip(logs, (True, False), strict=True):
        lines = []
        for i in range(3):
            lines.append(metrics(i, forward_s=0.4, backward_s=0.8, update_s=0.1))
            if profiled:  # its thread's CPU in the passes and update, the tree's in the round
                lines.append(
                    profile(
                        i,
                        forward_cpu_s=0.2,
                        backward_cpu_s=0.4,
                        update_cpu_s=0.05,
                        averaging_cpu_s=0.05,
                        frames_cpu_s=0.04,
                        frames=8,
                    )
                )
        path.write_text("\n".join(lines) + "\n")
    compute = measured_compute(logs, PLAN, [[0, 1]], micro_batches=2, cores={0: 0.25, 1: 0.1})
    assert compute is not None
    # CPU where profiled (per micro-batch), the wall time where not
    assert compute.forward_s == [[pytest.approx(0.1), pytest.approx(0.2)]]
    assert compute.backward_s == [[pytest.approx(0.2), pytest.approx(0.4)]]
    assert compute.update_s == [[pytest.approx(0.05), pytest.approx(0.1)]]
    # the round's and each frame's CPU seconds, as measured (the quota is the machine's); a
    # worker that did not profile adds none
    assert compute.averaging_local_s == [[0.05, 0.0]]
    assert compute.frame_local_s == [[pytest.approx(0.005), 0.0]]
    # the testbed's quota and its period (testbed/cpu.py): a 1 ms slice, a 5 ms floor
    assert compute.quota_cores == [[0.25, 0.1]]
    assert compute.quota_period_s == [[pytest.approx(0.005), pytest.approx(0.01)]]
    # without quotas for every stage: machines without one
    unlimited = measured_compute(logs, PLAN, [[0, 1]], micro_batches=2, cores={0: 0.25})
    assert unlimited is not None and unlimited.quota_cores == ()
    summary = compute_summary(logs, PLAN, [[0, 1]])
    assert summary["forward_cpu_s"] == [[0.2, None]] and summary["frame_cpu_s"] == [[0.005, None]]


def test_a_profile_counts_only_beside_its_own_steps_metrics(tmp_path: Path) -> None:
    """Profiles pair with metrics by plan and step: one of another plan, or of a step without
    metrics, is not taken."""
    log = tmp_path / "m0.jsonl"
    lines = [metrics(i, forward_s=0.4, backward_s=0.8, update_s=0.1) for i in range(3)]
    lines += [
        profile(1, forward_cpu_s=0.3, backward_cpu_s=0.5, update_cpu_s=0.1),
        profile(2, key=(1, 1), forward_cpu_s=9.0, backward_cpu_s=9.0, update_cpu_s=9.0),
        profile(7, forward_cpu_s=9.0, backward_cpu_s=9.0, update_cpu_s=9.0),
    ]
    log.write_text("\n".join(lines) + "\n")
    summary = compute_summary([log], PLAN, [[0]])
    assert summary["forward_cpu_s"] == [[0.3]] and summary["update_cpu_s"] == [[0.1]]


def test_the_rounds_cpu_splits_by_the_shares_summed_over_its_steps(tmp_path: Path) -> None:
    """The share of the round's CPU before its first part and after its last is a ratio of
    sums (the clock ticks in 10 ms: medians of the pieces would not add up); it splits the
    median round. A round that moved no part is not split: all of it counts before the wire."""
    logs = [tmp_path / f"m{i}.jsonl" for i in range(2)]
    split = [(0.05, 0.01, 0.02), (0.04, 0.02, 0.0), (0.06, 0.01, 0.01), (0.05, 0.0, 0.02)]
    for path, marked in zip(logs, (True, False), strict=True):
        lines = []
        for i, (total, before, after) in enumerate([(9.0, 9.0, 0.0), *split]):
            lines.append(metrics(i, forward_s=0.1, backward_s=0.2, update_s=0.0))
            wire: dict[str, Any] = {
                "averaging_cpu_before_s": before,
                "averaging_cpu_after_s": after,
            }
            lines.append(profile(i, averaging_cpu_s=total, **(wire if marked else {})))
        path.write_text("\n".join(lines) + "\n")
    compute = measured_compute(logs, PLAN, [[0], [1]], micro_batches=1)
    assert compute is not None
    # the first step left out: shares 0.04 / 0.20 before, 0.05 / 0.20 after of the median 0.05
    assert compute.averaging_local_s == [[pytest.approx(0.05)], [pytest.approx(0.05)]]
    assert compute.averaging_before_s == [[pytest.approx(0.05 * 0.2)], [pytest.approx(0.05)]]
    assert compute.averaging_after_s == [[pytest.approx(0.05 * 0.25)], [0.0]]
    summary = compute_summary(logs, PLAN, [[0], [1]])
    assert summary["averaging_before_share"] == [[0.2], [None]]


def test_frames_cost_their_own_cpu_and_the_helpers_run_as_a_background(tmp_path: Path) -> None:
    """Per frame: the worker's and daemon's CPU in the passes over the frames, summed over the
    steps; the helper processes' CPU in the passes over the passes' wall time (the step less
    its round and update) is a rate, cores."""
    log = tmp_path / "m0.jsonl"
    steps = [(0.03, 4, 0.01, 1.0), (0.02, 4, 0.02, 1.5), (0.05, 8, 0.0, 1.5)]
    lines = []
    for i, (frames_cpu, frames, helpers, step) in enumerate([(9.0, 1, 9.0, 9.0), *steps]):
        lines.append(
            metrics(i, forward_s=0.1, backward_s=0.2, update_s=0.1, averaging_s=0.4, step_s=step)
        )
        lines.append(profile(i, frames_cpu_s=frames_cpu, frames=frames, helpers_cpu_s=helpers))
    log.write_text("\n".join(lines) + "\n")
    compute = measured_compute([log], PLAN, [[0]], micro_batches=1, cores={0: 0.2})
    assert compute is not None
    assert compute.frame_local_s == [[pytest.approx(0.10 / 16)]]
    # 0.03 s of helpers' CPU over 0.5 + 1.0 + 1.0 s of passes
    assert compute.background_cores == [[pytest.approx(0.03 / 2.5)]]
    assert compute_summary([log], PLAN, [[0]])["helpers_cores"] == [[pytest.approx(0.012)]]
    # no quota: no background to take from one
    unlimited = measured_compute([log], PLAN, [[0]], micro_batches=1)
    assert unlimited is not None and unlimited.background_cores == ()
