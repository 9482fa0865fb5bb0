"""Checkpoints written beside training (worker/state_writer.py): a save returns before its
write ends, writes what the stage held when it was saved (not what it holds when the disk gets
to it), lands in step order, and a failed write is logged, not raised."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from p2ptrain.records import RunSpec
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker import state_writer
from p2ptrain.worker.state_writer import StateWrite, StateWriter

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10)


def _write_of(model: Any, optimizer: Any, *steps: int) -> StateWrite:
    snapshots = tuple(StageSnapshot.take(model, optimizer, step) for step in steps)
    return StateWrite(model, snapshots, None, lambda tag: True)


class HeldDisk:
    """record_step, held at the door until released: what a slow disk looks like to the writer."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.steps: list[int] = []

    def __call__(
        self, directory: Path, spec: RunSpec, model: Any, snapshot: Any, *rest: Any
    ) -> None:
        self.entered.set()
        assert self.release.wait(10)
        self.steps.append(snapshot.step)
        record_step(directory, spec, model, snapshot, *rest)


@pytest.fixture
def stage() -> tuple[Any, Any]:
    model = build_stage(SPEC, 0, 1)
    return model, make_optimizer(model, SPEC)


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[StateWriter, HeldDisk]:
    """A writer of tmp_path whose disk holds every write until released."""
    disk = HeldDisk()
    monkeypatch.setattr(state_writer, "record_step", disk)
    return StateWriter(tmp_path, SPEC), disk


def test_a_save_returns_before_its_write_and_writes_the_state_it_was_given(
    tmp_path: Path, stage: tuple[Any, Any], held: tuple[StateWriter, HeldDisk]
) -> None:
    model, optimizer = stage
    writer, disk = held
    saved = {name: t.clone() for name, t in model.state_dict().items()}
    writer.submit(_write_of(model, optimizer, 4))
    assert disk.entered.wait(10)
    assert writer.writing and list_states(tmp_path) == []  # the step goes on meanwhile
    with torch.no_grad():  # ...and changes the weights in place
        for parameter in model.parameters():
            parameter.add_(1.0)
    disk.release.set()
    writer.wait()
    assert not writer.writing
    [state] = list_states(tmp_path)
    assert state.step == 4
    written = state_file.read(state.path)["model_state"]
    assert written.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(written[name], tensor), name


def test_writes_land_in_step_order_and_a_last_save_is_on_disk_when_it_returns(
    tmp_path: Path, stage: tuple[Any, Any], held: tuple[StateWriter, HeldDisk]
) -> None:
    model, optimizer = stage
    writer, disk = held
    writer.submit(_write_of(model, optimizer, 19, 20))
    assert disk.entered.wait(10)
    threading.Timer(0.2, disk.release.set).start()
    writer.write_now(_write_of(model, optimizer, 25))  # waits for 19 and 20, then writes 25
    assert disk.steps == [19, 20, 25]
    assert [s.step for s in list_states(tmp_path)] == [19, 20, 25]
    assert not writer.writing


@pytest.mark.parametrize("beside", [True, False])
def test_a_failed_write_is_logged_and_the_next_save_still_writes(
    tmp_path: Path, stage: tuple[Any, Any], caplog: pytest.LogCaptureFixture, beside: bool
) -> None:
    model, optimizer = stage
    blocked = tmp_path / "checkpoints"
    blocked.write_text("a file where the directory should be")
    writer = StateWriter(blocked, SPEC, beside)
    with caplog.at_level(logging.ERROR, logger=state_writer.__name__):
        writer.submit(_write_of(model, optimizer, 3))
        writer.wait()
    assert "checkpoint: step 3 not written" in caplog.text
    blocked.unlink()
    writer.submit(_write_of(model, optimizer, 6))
    writer.wait()
    assert [s.step for s in list_states(blocked)] == [6]


def test_a_new_writer_deletes_what_a_writer_killed_mid_write_left(tmp_path: Path) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()  # the killed writer: its pid no longer runs
    torn = tmp_path / f"stage-L0-2.step20.pt.{finished.pid}.k2_x.tmp"
    torn.write_bytes(b"half a state")
    long_ago = time.time() - 600
    os.utime(torn, (long_ago, long_ago))
    StateWriter(tmp_path, SPEC)
    assert not torn.exists()


def test_on_a_cpu_device_a_save_is_written_before_it_returns(
    tmp_path: Path, stage: tuple[Any, Any]
) -> None:
    """There a thread would take its CPU from the steps (the module's docstring)."""
    model, optimizer = stage
    writer = StateWriter(tmp_path, SPEC, beside=False)
    writer.submit(_write_of(model, optimizer, 20))
    assert not writer.writing
    assert [s.step for s in list_states(tmp_path)] == [20]


def test_a_failed_write_at_a_sessions_end_is_logged_not_raised(
    tmp_path: Path, stage: tuple[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """write_now (a session's last save) raised: a full disk at a re-plan ended the worker,
    and the next session never started."""
    model, optimizer = stage
    blocked = tmp_path / "checkpoints"
    blocked.write_text("a file where the directory should be")
    writer = StateWriter(blocked, SPEC)
    with caplog.at_level(logging.ERROR, logger=state_writer.__name__):
        writer.write_now(_write_of(model, optimizer, 4))
    assert "checkpoint: step 4 not written" in caplog.text
