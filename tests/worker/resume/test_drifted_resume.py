"""Issue 28's churn: diloco's replicas drift apart once a round fails, so after a re-plan the
holders of different stages may share no saved step (the one ahead pruned its older states).
A stage with no state at or before the agreed step then resumes from its holder's oldest newer
state (worker/resume/restore.py), never from initial weights."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from p2ptrain.train.checkpoint import KEEP_STEPS, StageSnapshot, record_step, saved_steps
from p2ptrain.worker.resume.restore import restore_stage
from p2ptrain.worker.resume.start_step import choose_start_step, own_announcement, placement, usable
from tests.worker.resume.test_recut import SPEC, NoTransport, chain, plan, train_step


def test_a_stage_whose_holder_ran_ahead_resumes_from_its_oldest_newer_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    new_plan = plan((2, 2), 1)
    cut = new_plan.layer_ranges(SPEC.model.n_layer)
    behind, ahead = tmp_path / "a", tmp_path / "b"  # a holds L0-2 up to step 4, b L2-4 up to 9
    pipeline = chain(cut)
    states: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(9):
        train_step(pipeline, step)
        first, second = pipeline
        if step + 1 <= 4:
            record_step(behind, SPEC, first[0], StageSnapshot.take(*first, step + 1))
        record_step(ahead, SPEC, second[0], StageSnapshot.take(*second, step + 1))
        states[step + 1] = {n: t.clone() for n, t in second[0].state_dict().items()}
    assert saved_steps(ahead) == {"L2-4": list(range(10 - KEEP_STEPS, 10))}  # 1-5 pruned

    members, placed = placement(new_plan, SPEC.model.n_layer)
    rank = new_plan.state_rank
    held = {"a": usable(own_announcement(behind, rank), rank)}
    held["b"] = usable(own_announcement(ahead, rank), rank)
    start = choose_start_step(list(placed), held, placed, members)
    assert start.step == 4 and "share no step" in start.note

    stage, optimizer = chain(cut)[1]
    with caplog.at_level(logging.WARNING):
        step = restore_stage(SPEC, new_plan, NoTransport(), ahead, stage, optimizer, start)  # type: ignore[arg-type]
    assert step == 4
    assert "STAGE STATE LOST" not in caplog.text
    assert "resumed from step 6 for step 4" in caplog.text
    assert all(torch.equal(states[6][n], t) for n, t in stage.state_dict().items())
