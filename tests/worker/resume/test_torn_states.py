"""A state file a power cut tore (an empty, zeroed or short file under a stamped name) is never
announced (worker/resume/adopt.py `intact`), and of two states of one lineage at one step (a plan
restarted a stage below steps it saved) every reader takes the later epoch's, as the writer does
(own_states.py, adopt.py, copy_server.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from p2ptrain.records.lineage import rank
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import stamped_path
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker.resume.adopt import announceable, intact
from p2ptrain.worker.resume.copy_server import CopyRequest, CopyServer
from p2ptrain.worker.resume.own_states import local_states, own_announcement
from p2ptrain.worker.resume.state_transfer import StateServer
from tests.worker.resume.test_spare_copies import SPEC, one_pipeline

LINEAGE = "a" * 16
LAYERS = range(0, 1)


def save(directory: Path, step: int, tag: str | None, shift: float = 0.0) -> Path:
    model = build_stage(SPEC, 0, 2)
    with torch.no_grad():
        next(model.parameters()).add_(shift)
    snapshot = StageSnapshot.take(model, make_optimizer(model, SPEC), step)
    record_step(directory, SPEC, model, snapshot, tag, lambda t: True)
    return stamped_path(directory, LAYERS, step, tag)


def tear(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    stamp = path.stat().st_mtime + 1  # a new mtime: what the header check remembers changes
    os.utime(path, (stamp, stamp))


@pytest.mark.parametrize(
    "torn",
    [
        lambda whole: b"",  # renamed before its bytes reached the disk
        lambda whole: b"\0" * len(whole),  # zeroed
        lambda whole: whole[: len(whole) - 1],  # short by a byte
        lambda whole: whole + b"\0" * 8,  # longer than its tensors
    ],
)
def test_a_torn_newest_state_is_not_announced_the_older_ones_are(tmp_path: Path, torn) -> None:  # type: ignore[no-untyped-def]
    for step in (1, 2, 3):
        newest = save(tmp_path, step, None)
    assert intact(newest)
    tear(newest, torn(newest.read_bytes()))
    assert not intact(newest)
    every = lambda tag: 0  # noqa: E731
    assert sorted(own_announcement(tmp_path, every)["L0-1"]) == [1, 2]
    assert sorted(announceable(tmp_path, every, None, 10)["L0-1"]) == [1, 2]


def test_a_pickled_state_of_an_older_format_is_still_announced(tmp_path: Path) -> None:
    old = stamped_path(tmp_path, LAYERS, 4)
    old.write_bytes(b"PK\x03\x04" + b"\0" * 64)  # torch.save's zip: only loading reads it
    assert intact(old)
    assert intact(save(tmp_path, 5, None))
    assert not intact(tmp_path / "gone.pt")


@pytest.mark.parametrize("earlier, later", [(3, 4), (9, 10)])
def test_of_two_epochs_at_one_step_the_later_is_used_announced_and_served(
    tmp_path: Path, earlier: int, later: int
) -> None:
    """By tag, "X-e3" came first (and "X-e10" before "X-e9"): the earlier epoch's state won."""
    old, new = f"{LINEAGE}-e{earlier}", f"{LINEAGE}-e{later}"
    save(tmp_path, 101, old, shift=0.25)
    save(tmp_path, 101, new, shift=0.5)
    lineage = ((LINEAGE, later),)

    def plan_rank(tag: str | None) -> int | None:
        return rank(lineage, tag)

    assert local_states(tmp_path, plan_rank)["L0-1"][101].tag == new
    assert announceable(tmp_path, plan_rank, None, 10)["L0-1"][101].tag == new
    assert own_announcement(tmp_path, plan_rank)["L0-1"][101][1] == new

    plan = one_pipeline().replace(lineage=lineage, epoch=later)
    states = StateServer(None)
    states.serve_run(SPEC.replace(steps=200), tmp_path, plan)
    server = CopyServer(states, "h", None, lambda: plan)
    newest = server._newest(CopyRequest(LAYERS, 0))
    assert newest is not None and newest[1] == new


def test_another_lineage_s_later_epoch_is_the_one_adopted(tmp_path: Path) -> None:
    save(tmp_path, 7, f"{LINEAGE}-e3", shift=0.25)
    save(tmp_path, 7, f"{LINEAGE}-e4", shift=0.5)
    found = announceable(tmp_path, lambda tag: None, SPEC, 10)
    assert found["L0-1"][7].tag == f"{LINEAGE}-e4"
