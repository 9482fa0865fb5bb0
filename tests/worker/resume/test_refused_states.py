"""A fetched stage state whose AdamW part is hostile (train/state_checks.py) is refused like a
file of bad weights: the fetch path deletes it and tries the next holder, and with none left the
stage starts from initial weights; the worker never crashes in optimizer.step() and never
takes a holder's hyperparameters."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states, stamped_path
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker.resume import restore
from p2ptrain.worker.resume.restore import restore_stage
from p2ptrain.worker.resume.start_choice import StartPoint
from tests.train.test_state_checks import HOSTILE_HYPERPARAMETERS, crafted
from tests.worker.resume.test_recut import SPEC, chain, plan, train_step

KEY = "L2-4"


class Transport:
    peer_id = "b"


def _holders(tmp_path: Path) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """An honest state of L2-4 at step 3, and a hostile copy: hostile hyperparameters and a
    negative second moment (AdamW's square root of it is NaN)."""
    cut = plan((2, 2), 1).layer_ranges(SPEC.model.n_layer)
    pipeline = chain(cut)
    for step in range(3):
        train_step(pipeline, step)
    stage, optimizer = pipeline[1]
    record_step(tmp_path / "y", SPEC, stage, StageSnapshot.take(stage, optimizer, 3))
    honest = stamped_path(tmp_path / "y", stage.layers, 3)

    def negative(tensors: dict[str, torch.Tensor]) -> None:
        tensors["optim/0/exp_avg_sq"] = -tensors["optim/0/exp_avg_sq"] - 1.0

    def hostile_groups(meta: dict[str, Any]) -> None:
        for group in meta["param_groups"]:
            group.update(HOSTILE_HYPERPARAMETERS)

    hostile = crafted(honest, tmp_path / "x" / honest.name, negative, hostile_groups)
    return honest, hostile, {n: t.clone() for n, t in stage.state_dict().items()}


def _trains(stage: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """An AdamW step of the restored (last) stage runs, and its weights stay finite."""
    stage(torch.randn(2, 8, 16)).float().pow(2).mean().backward()
    optimizer.step()
    assert all(bool(torch.isfinite(p).all()) for p in stage.parameters())


def _restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: dict[str, Path]
) -> tuple[int, torch.nn.Module, torch.optim.Optimizer, list[str]]:
    asked: list[str] = []

    def fetch_state(
        transport, peer, layers, step, directory, digest, max_bytes, network, tag, *rest
    ):  # type: ignore[no-untyped-def]
        asked.append(peer)
        target = stamped_path(directory, layers, step, tag)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(served[peer], target)
        return target

    monkeypatch.setattr(restore, "fetch_state", fetch_state)
    new_plan = plan((2, 2), 1)
    held = {peer: {KEY: {3: "agreed"}} for peer in served}
    start = StartPoint(3, "", held=held, digests={KEY: "agreed"})
    stage, optimizer = chain(new_plan.layer_ranges(SPEC.model.n_layer))[1]
    directory = tmp_path / "b"
    step = restore_stage(SPEC, new_plan, Transport(), directory, stage, optimizer, start).step  # type: ignore[arg-type]
    return step, stage, optimizer, asked


def test_a_hostile_state_is_refused_and_the_next_holder_s_is_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    honest, hostile, weights = _holders(tmp_path)
    with caplog.at_level(logging.WARNING):
        step, stage, optimizer, asked = _restore(tmp_path, monkeypatch, {"x": hostile, "y": honest})
    assert step == 3 and asked == ["x", "y"]
    assert "from x failed" in caplog.text and "exp_avg_sq is negative" in caplog.text
    assert all(torch.equal(weights[n], t) for n, t in stage.state_dict().items())
    expected = make_optimizer(stage, SPEC).state_dict()["param_groups"]
    assert optimizer.state_dict()["param_groups"] == expected
    _trains(stage, optimizer)


def test_a_lone_hostile_holder_s_state_is_refused_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, hostile, weights = _holders(tmp_path)
    with caplog.at_level(logging.WARNING):
        step, stage, optimizer, asked = _restore(tmp_path, monkeypatch, {"x": hostile})
    assert step == 3 and asked == ["x"]
    assert "STAGE STATE LOST" in caplog.text
    assert not list_states(tmp_path / "b")  # nothing left to crash-loop on at a restart
    assert not optimizer.state
    assert not all(torch.equal(weights[n], t) for n, t in stage.state_dict().items())
    _trains(stage, optimizer)
