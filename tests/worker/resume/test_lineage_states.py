"""Stage states of a plan's lineage only (records/lineage.py): tagged on disk
(train/checkpoint.py), announced with their tag and kept only if the plan descends from it
(worker/resume/start_choice.py), resumed from locally only then (worker/resume/restore.py).

Issue 11, attack 4b's last part: after a partition heals, states named only by layers and step
mixed silently: the other half's newer states won the start step, or were resumed from."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from p2ptrain.records import Plan
from p2ptrain.records.lineage import Lineage, next_lineage
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states, stamped_path
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker.resume.announcement import check_announcement, sign_announcement
from p2ptrain.worker.resume.own_states import local_states, own_announcement, usable
from p2ptrain.worker.resume.restore import warn_other_lineages
from p2ptrain.worker.resume.start_choice import choose_start_step
from tests.train.test_checkpoint import SPEC
from tests.worker.resume.test_resume import KEY, PEER, SEED, d


def plan(term: int, epoch: int, planner: str, lineage: Lineage) -> Plan:
    return Plan(
        term=term,
        epoch=epoch,
        planner=planner,
        stages=1,
        pipelines=(("A",),),
        spares=(),
        data_addrs={},
        cost_s=0.0,
        lineage=lineage,
    )


# the common ancestor (planner P, term 1, epoch 2), then a partition: one half elects Q
ANCESTOR = plan(1, 2, "P", next_lineage((), False, 1, 2, "P"))
LEFT = plan(2, 1, "Q", next_lineage(ANCESTOR.lineage, False, 2, 1, "Q"))
# the other half kept P and re-planned without the left half (epoch 3, past the fork)
RIGHT = plan(1, 3, "P", next_lineage(ANCESTOR.lineage, True, 1, 3, "P"))


def save(directory: Path, step: int, under: Plan | None) -> None:
    model = build_stage(SPEC, 0, 2)
    optimizer = make_optimizer(model, SPEC)
    tag = None if under is None else under.state_tag
    record_step(directory, SPEC, model, StageSnapshot.take(model, optimizer, step), tag)


def test_a_state_is_saved_and_listed_with_its_lineage_tag(tmp_path: Path) -> None:
    save(tmp_path, 3, LEFT)
    save(tmp_path, 2, None)  # the root lineage: the name states had before lineages
    listed = {(s.step, s.tag) for s in list_states(tmp_path)}
    assert listed == {(3, LEFT.state_tag), (2, None)}
    assert stamped_path(tmp_path, range(0, 1), 3, LEFT.state_tag).is_file()
    assert stamped_path(tmp_path, range(0, 1), 2).name == "stage-L0-1.step2.pt"


def test_the_other_halfs_announced_states_do_not_count() -> None:
    """After the heal, under the left half's plan: two right-half members announce a newer step
    of their own lineage (two voices make a step usable); the start stays at the left half's."""
    tag_left, tag_right, tag_anc = LEFT.state_tag, RIGHT.state_tag, ANCESTOR.state_tag
    left_states = {"L0-2": {5: (d("left@5"), tag_left), 4: (d("anc@4"), tag_anc)}}
    right_states = {"L0-2": {7: (d("right@7"), tag_right), 4: (d("anc@4"), tag_anc)}}
    value = sign_announcement(SEED, KEY, PEER, right_states)
    assert check_announcement(value, KEY, PEER, 40) == right_states  # read, then filtered
    rank = LEFT.state_rank
    held = {"a": usable(left_states, rank)} | {p: usable(right_states, rank) for p in "bc"}
    assert held["b"] == {"L0-2": {4: d("anc@4")}}  # only the common ancestor's state
    start = choose_start_step(["L0-2"], held, {"L0-2": {"a"}}, ["a", "b", "c"])
    assert start.step == 5 and start.digests == {"L0-2": d("left@5")}
    # unfiltered (states named by layers and step only), the other half's step won
    unfiltered = {"a": usable(left_states, lambda tag: 0)}
    unfiltered |= {p: usable(right_states, lambda tag: 0) for p in "bc"}
    assert choose_start_step(["L0-2"], unfiltered, {"L0-2": {"a"}}, ["a", "b", "c"]).step == 7
    # the ancestor's state is usable to both halves
    assert usable(left_states, RIGHT.state_rank) == {"L0-2": {4: d("anc@4")}}


def test_a_local_state_of_another_lineage_is_not_resumed_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, 4, ANCESTOR)
    save(tmp_path, 6, RIGHT)  # this machine trained on in the right half
    save(tmp_path, 5, LEFT)  # fetched from the left half after the heal
    local = local_states(tmp_path, LEFT.state_rank)
    assert sorted(local["L0-1"]) == [4, 5]  # not 6: another lineage's
    assert local["L0-1"][5].tag == LEFT.state_tag
    mine = own_announcement(tmp_path, LEFT.state_rank)
    assert sorted(mine["L0-1"]) == [4, 5]  # never announced either
    with caplog.at_level(logging.WARNING):
        warn_other_lineages(tmp_path, LEFT.state_rank, "L0-1", 5)
    assert "not resuming layers L0-1 from local states at steps [6]" in caplog.text
    assert str(RIGHT.state_tag) in caplog.text


def test_the_closest_lineage_wins_a_step_held_twice(tmp_path: Path) -> None:
    save(tmp_path, 4, ANCESTOR)
    save(tmp_path, 4, LEFT)  # the same step re-saved under the new plan
    assert local_states(tmp_path, LEFT.state_rank)["L0-1"][4].tag == LEFT.state_tag
    assert local_states(tmp_path, ANCESTOR.state_rank)["L0-1"][4].tag == ANCESTOR.state_tag


def test_pruning_keeps_the_writers_lineage_and_leaves_newer_foreign_states(
    tmp_path: Path,
) -> None:
    model = build_stage(SPEC, 0, 2)
    optimizer = make_optimizer(model, SPEC)
    for step in (10, 11):
        save(tmp_path, step, RIGHT)  # the other half's, newer than ours
    for step in range(1, 8):
        record_step(
            tmp_path,
            SPEC,
            model,
            StageSnapshot.take(model, optimizer, step),
            LEFT.state_tag,
            lambda tag: LEFT.state_rank(tag) is not None,
        )
    left = [s.step for s in list_states(tmp_path) if s.tag == LEFT.state_tag]
    assert left == [4, 5, 6, 7]  # the newest KEEP_STEPS of ours, not crowded out
    assert [s.step for s in list_states(tmp_path) if s.tag == RIGHT.state_tag] == [10, 11]
