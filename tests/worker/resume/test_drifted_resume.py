"""Issue 28's churn: diloco's replicas drift apart once a round fails, so after a re-plan the
holders of different stages may share no saved step (the one ahead pruned its older states).
A stage with no state at or before the agreed step then resumes from its oldest newer state,
agreed by digest so that the member placed there fetches it from whoever holds it, a spare
included (worker/resume/start_step.py, restore.py), never from initial weights."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from p2ptrain.train.checkpoint import KEEP_STEPS, record_step
from p2ptrain.train.checkpoint_folder import saved_steps, stamped_path
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume import restore
from p2ptrain.worker.resume.own_states import own_announcement, usable
from p2ptrain.worker.resume.restore import restore_stage
from p2ptrain.worker.resume.start_choice import choose_start_step, placement
from tests.worker.resume.test_recut import SPEC, NoTransport, chain, plan, train_step
from tests.worker.resume.test_resume import d, steps


def drift(cut: list[range], behind: Path, ahead: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Train the two stages of `cut` 9 steps; `behind` saves the first up to step 4, `ahead`
    the second at every step (pruned to its newest). The second stage's weights by step."""
    pipeline = chain(cut)
    states: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(9):
        train_step(pipeline, step)
        first, second = pipeline
        if step + 1 <= 4:
            record_step(behind, SPEC, first[0], StageSnapshot.take(*first, step + 1))
        record_step(ahead, SPEC, second[0], StageSnapshot.take(*second, step + 1))
        states[step + 1] = {n: t.clone() for n, t in second[0].state_dict().items()}
    return states


def test_a_stage_whose_holder_ran_ahead_resumes_from_its_oldest_newer_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    new_plan = plan((2, 2), 1)
    cut = new_plan.layer_ranges(SPEC.model.n_layer)
    behind, ahead = tmp_path / "a", tmp_path / "b"  # a holds L0-2 up to step 4, b L2-4 up to 9
    states = drift(cut, behind, ahead)
    assert saved_steps(ahead) == {"L2-4": list(range(10 - KEEP_STEPS, 10))}  # 1-5 pruned

    members, placed = placement(new_plan, SPEC.model.n_layer)
    rank = new_plan.state_rank
    held = {"a": usable(own_announcement(behind, rank), rank)}
    held["b"] = usable(own_announcement(ahead, rank), rank)
    start = choose_start_step(list(placed), held, placed, members)
    assert start.step == 4 and "share no step" in start.note

    stage, optimizer = chain(cut)[1]
    with caplog.at_level(logging.WARNING):
        step = restore_stage(SPEC, new_plan, NoTransport(), ahead, stage, optimizer, start).step  # type: ignore[arg-type]
    assert step == 4
    assert "STAGE STATE LOST" not in caplog.text
    assert "resumed from step 6 for step 4" in caplog.text
    assert all(torch.equal(states[6][n], t) for n, t in stage.state_dict().items())


def test_a_stage_held_only_by_a_spare_that_ran_ahead_is_agreed_at_its_oldest_newer_step() -> None:
    """The churn test's re-plan (2 stages; a replica killed; 3 survivors as 1 x 2 and a spare):
    stage L0-1's member p1 stopped at step 9 (its pipeline waited on the dead peer), p2 ran
    L0-1 to 14 and now trains L1-2, and the only holder of L1-2 is the spare p0, which ran to
    14 and pruned its states before 11. The start is 9; L1-2 is agreed at 11, by its digest, so
    p2 fetches p0's state there (never initial weights: STAGE STATE LOST)."""
    held = {
        "p1": steps("L0-1", 6, 7, 8, 9),
        "p2": steps("L0-1", 11, 12, 13, 14),
        "p0": steps("L1-2", 11, 12, 13, 14),
    }
    placed = {"L0-1": {"p1"}, "L1-2": {"p2"}}
    start = choose_start_step(["L0-1", "L1-2"], held, placed, ["p1", "p2", "p0"])
    assert start.step == 9 and "share no step" in start.note
    assert start.digests["L0-1"] == d("L0-1@9")  # p2's newer lone L0-1 states do not count
    assert start.steps == {"L1-2": 11} and start.digests["L1-2"] == d("L1-2@11")
    assert start.state_step("L1-2") == 11 and start.state_step("L0-1") == 9
    start = replace(start, held=held)
    assert start.holders("L1-2", 11) == ["p0"]
    # a stage with a usable state before the start takes its newest, wherever it is held
    held["p0"] = steps("L1-2", 4, 5, 11)
    start = choose_start_step(["L0-1", "L1-2"], held, placed, ["p1", "p2", "p0"])
    assert start.step == 9 and start.steps == {"L1-2": 5}


def test_a_member_fetches_its_stage_s_later_state_from_the_spare_that_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """restore_stage with a `steps` agreement: c, placed at L2-4 with nothing of it, fetches
    the agreed state at its own step (6) from the spare s, checks its digest and resumes."""
    new_plan = dataclasses.replace(plan((2, 2), 2), pipelines=(("a", "c"),), spares=("s",))
    cut = new_plan.layer_ranges(SPEC.model.n_layer)
    behind, spare, empty = tmp_path / "a", tmp_path / "s", tmp_path / "c"
    states = drift(cut, behind, spare)
    members, placed = placement(new_plan, SPEC.model.n_layer)
    rank = new_plan.state_rank
    held = {"a": usable(own_announcement(behind, rank), rank)}
    held["s"] = usable(own_announcement(spare, rank), rank)
    start = choose_start_step(list(placed), held, placed, members)
    assert start.step == 4 and start.steps == {"L2-4": 6}
    start = dataclasses.replace(start, held=held)

    asked = []

    def fetch_state(
        transport, peer, layers, step, directory, digest, max_bytes, network, tag, *rest
    ):  # type: ignore[no-untyped-def]
        asked.append((peer, step))
        source = stamped_path(spare, layers, step, None)
        assert file_sha256(source) == digest
        target = stamped_path(directory, layers, step, tag)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return target

    monkeypatch.setattr(restore, "fetch_state", fetch_state)

    class Transport:
        peer_id = "c"

    stage, optimizer = chain(cut)[1]
    with caplog.at_level(logging.WARNING):
        step = restore_stage(SPEC, new_plan, Transport(), empty, stage, optimizer, start).step  # type: ignore[arg-type]
    assert step == 4 and asked == [("s", 6)]
    assert "STAGE STATE LOST" not in caplog.text
    assert "resumed from step 6 for step 4" in caplog.text
    assert all(torch.equal(states[6][n], t) for n, t in stage.state_dict().items())


def test_an_unloadable_own_state_is_set_aside_not_the_end_of_the_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Our own agreed state does not load (torn, or another run's): it is set aside and the
    agreed state fetched from another holder, else our next older state loaded; with none, the
    stage starts over, loudly. It used to end the worker (exit 2), at every restart, and then
    to restart the stage from initial weights though its older states lay on disk."""
    new_plan = plan((2, 2), 1)
    cut = new_plan.layer_ranges(SPEC.model.n_layer)
    behind, ahead = tmp_path / "a", tmp_path / "b"
    states = drift(cut, behind, ahead)
    members, placed = placement(new_plan, SPEC.model.n_layer)
    rank = new_plan.state_rank
    held = {"b": usable(own_announcement(ahead, rank), rank)}
    start = choose_start_step(["L2-4"], held, {"L2-4": placed["L2-4"]}, members)
    assert start.step == 9
    torn = stamped_path(ahead, cut[1], start.step)
    torn.write_bytes(torn.read_bytes()[:1000])  # a write cut short by a power loss
    older = stamped_path(ahead, cut[1], 8)
    older.write_bytes(b"\0" * older.stat().st_size)  # zeroed as well: the next older one loads

    stage, optimizer = chain(cut)[1]
    with caplog.at_level(logging.WARNING):
        step = restore_stage(SPEC, new_plan, NoTransport(), ahead, stage, optimizer, start).step  # type: ignore[arg-type]
    assert step == start.step
    for bad in (torn, older):
        assert not bad.exists() and bad.with_name(bad.name + ".unloadable").exists()
    assert "STAGE STATE LOST" not in caplog.text
    assert "layers L2-4 resumed from step 7 for step 9" in caplog.text
    assert all(torch.equal(states[7][n], t) for n, t in stage.state_dict().items())

    for state in (6, 7):  # no state of the stage here loads, and no other holder: said, no crash
        stamped_path(ahead, cut[1], state).write_bytes(b"")
    caplog.clear()
    stage, optimizer = chain(cut)[1]
    with caplog.at_level(logging.WARNING):
        restored = restore_stage(SPEC, new_plan, NoTransport(), ahead, stage, optimizer, start)  # type: ignore[arg-type]
    assert restored.step == start.step and restored.lost == "L2-4"
    assert "STAGE STATE LOST" in caplog.text


def test_untagged_states_of_another_run_are_not_announced(tmp_path: Path) -> None:
    """An untagged state (the root's: usable by every plan) in the directory that belongs to
    another run (copied in, an older version's) was announced, agreed, and refused by the
    loader, which ended every worker."""
    new_plan = plan((2, 2), 1)
    cut = new_plan.layer_ranges(SPEC.model.n_layer)
    drift(cut, tmp_path / "a", tmp_path / "b")
    rank = new_plan.state_rank
    assert own_announcement(tmp_path / "b", rank, run=SPEC)  # our run's: announced
    other = SPEC.replace(run_id="second-run")
    assert own_announcement(tmp_path / "b", rank, run=other) == {}


def test_a_stage_no_member_holds_says_it_restarted_not_that_it_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A walk-through: a stage's only holder stopped, its spare took the stage from initial
    weights, and its progress line, `status` and metrics said "resumed from step 2244"."""
    new_plan = plan((2, 2), 1)
    cut = new_plan.layer_ranges(SPEC.model.n_layer)
    behind, ahead, empty = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    drift(cut, behind, ahead)
    shutil.rmtree(ahead)  # L2-4's only holder is gone
    members, placed = placement(new_plan, SPEC.model.n_layer)
    rank = new_plan.state_rank
    start = choose_start_step(
        list(placed), {"a": usable(own_announcement(behind, rank), rank)}, placed, members
    )
    assert start.step == 4
    stage, optimizer = chain(cut)[1]
    with caplog.at_level(logging.WARNING):
        restored = restore_stage(SPEC, new_plan, NoTransport(), empty, stage, optimizer, start)  # type: ignore[arg-type]
    assert "STAGE STATE LOST" in caplog.text
    assert restored == restore.Restored(4, "L2-4")  # the session's metrics: lineage ""
    said = restore.started_line(SPEC, new_plan, start, empty, restored.lost)
    assert said == "started from initial weights at step 4: layers L2-4 were lost"
