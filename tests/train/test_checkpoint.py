from pathlib import Path

import pytest
import torch

from p2ptrain.errors import UserError
from p2ptrain.runspec import RunSpec
from p2ptrain.train.checkpoint import checkpoint_path, load_stage, save_stage
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer

SPEC = RunSpec(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10)


def _trained_stage(stage: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_stage(SPEC, stage, 2)
    optimizer = make_optimizer(model, SPEC)
    x = torch.randint(0, 256, (2, 8)) if stage == 0 else torch.randn(2, 8, 16)
    model(x).float().pow(2).mean().backward()
    optimizer.step()
    return model, optimizer


def test_round_trip_restores_weights_optimizer_and_step(tmp_path: Path) -> None:
    model, optimizer = _trained_stage(1)
    path = checkpoint_path(tmp_path, model.layers)  # type: ignore[arg-type]
    save_stage(path, SPEC, model, optimizer, step=7)  # type: ignore[arg-type]
    fresh = build_stage(SPEC, 1, 2)
    fresh_opt = make_optimizer(fresh, SPEC)
    assert load_stage(path, SPEC, fresh, fresh_opt) == 7
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_mismatched_or_corrupt_checkpoints_are_refused(tmp_path: Path) -> None:
    model, optimizer = _trained_stage(0)
    path = tmp_path / "c.pt"
    save_stage(path, SPEC, model, optimizer, step=3)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="layers"):
        load_stage(path, SPEC, build_stage(SPEC, 1, 2))
    with pytest.raises(UserError, match="run"):
        load_stage(path, SPEC.replace(run_id="other"), build_stage(SPEC, 0, 2))
    with pytest.raises(UserError, match="model"):
        load_stage(path, SPEC.replace(n_embd=32), build_stage(SPEC.replace(n_embd=32), 0, 2))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match="unreadable"):
        load_stage(path, SPEC, build_stage(SPEC, 0, 2))
