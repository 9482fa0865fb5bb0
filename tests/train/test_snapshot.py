"""A stage's host snapshot (train/snapshot.py): a copy, never a view of the live state; the step's
snapshot reuses the buffers of the one before where they fit and writes the file the fresh copy
would; on a GPU its buffers are pinned and the copy lands before anything reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from p2ptrain.records import RunSpec
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.checkpoint_read import read_state
from p2ptrain.train.model import build_stage, loss_fn
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10)


def _stage(device: str = "cpu") -> tuple[Any, Any]:
    model = build_stage(SPEC, 0, 1).to(device)
    return model, make_optimizer(model, SPEC)


def _train_step(model: Any, optimizer: Any, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, SPEC.model.vocab_size, (4, 8), generator=generator)
    device = next(model.parameters()).device
    loss_fn(model(x.to(device)), x.to(device)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested state, by its path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        items = list(state.items())
    else:
        items = list(enumerate(state)) if isinstance(state, list | tuple) else []
    found: dict[str, torch.Tensor] = {}
    for key, item in items:
        found |= _tensors(item, f"{prefix}/{key}")
    return found


def _same_values(snapshot: StageSnapshot, model: Any, optimizer: Any) -> None:
    expected = _tensors(model.state_dict()) | _tensors(optimizer.state_dict(), "opt")
    got = _tensors(snapshot.model_state) | _tensors(snapshot.optimizer_state, "opt")
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        assert got[key].device.type == "cpu"
        assert torch.equal(got[key], tensor.cpu()), key


def test_a_snapshot_is_a_copy_that_training_does_not_change() -> None:
    model, optimizer = _stage()
    _train_step(model, optimizer, 0)
    snapshot = StageSnapshot.take(model, optimizer, 1)
    before = {k: v.clone() for k, v in _tensors(snapshot.model_state).items()}
    _train_step(model, optimizer, 1)
    after = _tensors(snapshot.model_state)
    assert all(torch.equal(before[key], after[key]) for key in before)
    live = _tensors(model.state_dict())
    assert any(not torch.equal(live[key], after[key]) for key in live)


def test_the_next_step_s_snapshot_reuses_the_buffers_and_holds_the_new_values() -> None:
    model, optimizer = _stage()
    first = StageSnapshot.take(model, optimizer, 0, lasting=True)  # no AdamW moments yet
    _train_step(model, optimizer, 0)
    second = StageSnapshot.take(model, optimizer, 1, reuse=first, lasting=True)
    # the weights' buffers are the first's; the moments appeared since: new buffers
    firsts = {k: v.data_ptr() for k, v in _tensors(first.model_state).items()}
    seconds = _tensors(second.model_state)
    assert all(seconds[key].data_ptr() == ptr for key, ptr in firsts.items())
    _same_values(second, model, optimizer)
    moments = {k: v.data_ptr() for k, v in _tensors(second.optimizer_state).items()}
    _train_step(model, optimizer, 1)
    third = StageSnapshot.take(model, optimizer, 2, reuse=second, lasting=True)
    assert {k: v.data_ptr() for k, v in _tensors(third.optimizer_state).items()} == moments
    _same_values(third, model, optimizer)


def test_a_reused_snapshot_writes_the_state_a_fresh_one_writes(tmp_path: Path) -> None:
    model, optimizer = _stage()
    kept = StageSnapshot.take(model, optimizer, 0, lasting=True)
    for step in range(3):
        _train_step(model, optimizer, step)
        kept = StageSnapshot.take(model, optimizer, step + 1, reuse=kept, lasting=True)
    fresh = StageSnapshot.take(model, optimizer, 3)
    record_step(tmp_path / "kept", SPEC, model, kept)
    record_step(tmp_path / "fresh", SPEC, model, fresh)
    (kept_file,) = list_states(tmp_path / "kept")
    (fresh_file,) = list_states(tmp_path / "fresh")
    assert kept_file.path.read_bytes() == fresh_file.path.read_bytes()
    state = read_state(kept_file.path, SPEC, model.layers)
    assert state["step"] == 3


def test_a_buffer_of_another_shape_is_not_reused() -> None:
    model, optimizer = _stage()
    wider = build_stage(SPEC.replace(n_embd=32), 0, 1)  # the same names, other shapes
    older = StageSnapshot.take(wider, make_optimizer(wider, SPEC), 0)
    snapshot = StageSnapshot.take(model, optimizer, 0, reuse=older)
    _same_values(snapshot, model, optimizer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_buffers_are_pinned_and_the_copy_lands_before_it_is_read() -> None:
    model, optimizer = _stage("cuda")
    _train_step(model, optimizer, 0)
    kept = StageSnapshot.take(model, optimizer, 1, lasting=True)
    _train_step(model, optimizer, 1)
    kept = StageSnapshot.take(model, optimizer, 2, reuse=kept, lasting=True)
    expected = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    _train_step(model, optimizer, 2)  # queued behind the copy on the same stream
    assert kept.copied is not None
    settled = kept.settled()
    assert all(t.is_pinned() for t in _tensors(settled.model_state).values())
    assert all(torch.equal(settled.model_state[k], v) for k, v in expected.items())
