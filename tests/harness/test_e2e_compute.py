"""bench e2e's stage timings: read from workers' metrics logs, into the simulation's grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2ptrain.harness.e2e_compute import compute_summary, measured_compute, steady_step_s

PLAN = (1, 2)


def write_log(path: Path, steps: list[tuple[float, float, float]], key: tuple[int, int] = PLAN):
    lines = [json.dumps({"type": "session", "plan": {}})]
    for i, (forward, backward, update) in enumerate(steps):
        lines.append(json.dumps({
            "type": "metrics", "step": i, "term": key[0], "epoch": key[1], "forward_s": forward,
            "backward_s": backward, "update_s": update, "averaging_s": 0.5 + i,
        }))  # fmt: skip
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
        path.write_text("\n".join(json.dumps({
            "type": "metrics", "step": i, "term": 1, "epoch": 2, "forward_s": 0.1,
            "backward_s": 0.2, "update_s": 0.0, "step_s": s,
        }) for i, s in enumerate(periods)) + "\n")  # fmt: skip
    # worker 0: median of 1.0, 1.2, 1.1 = 1.1; worker 1: of 0.9, 0.8, 3.0 = 0.9; worker 2 unplaced
    assert steady_step_s(logs, PLAN, [[0, 1]]) == pytest.approx(1.0)
    assert compute_summary(logs, PLAN, [[0, 1]])["step_s"] == [[1.1, 0.9]]
    assert steady_step_s(logs, (9, 9), [[0, 1]]) is None
