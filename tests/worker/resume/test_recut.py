"""A re-plan that cuts the model anew loses no state: stages L0-3 and L3-4 are built from the
saved L0-2 and L2-4 (worker/resume/covers.py chooses, train/recut.py renames, worker/resume/restore.py
builds and saves), bit for bit, and training goes on exactly as under the old cut."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2ptrain.records import Plan
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.model import Stage, build_layers, loss_fn
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.recut import model_wide
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker.resume.own_states import own_announcement, usable
from p2ptrain.worker.resume.restore import restore_stage
from p2ptrain.worker.resume.start_choice import choose_start_step, placement

SPEC = RunSpec().replace(n_layer=4, n_head=2, n_embd=16, block_size=8, steps=10, seed=3)


def plan(stage_layers: tuple[int, ...], epoch: int) -> Plan:
    return Plan(
        term=1,
        epoch=epoch,
        planner="P",
        stages=2,
        pipelines=(("a", "b"),),
        spares=(),
        data_addrs={},
        cost_s=0.0,
        stage_layers=stage_layers,
    )


def chain(cut: list[range]) -> list[tuple[Stage, torch.optim.Optimizer]]:
    stages = [build_layers(SPEC, layers) for layers in cut]
    return [(stage, make_optimizer(stage, SPEC)) for stage in stages]


def train_step(pipeline: list[tuple[Stage, torch.optim.Optimizer]], step: int) -> None:
    """One step of the whole pipeline in one process (autograd across the stages)."""
    generator = torch.Generator().manual_seed(step)
    tokens = torch.randint(
        0, SPEC.model.vocab_size, (2, SPEC.model.block_size + 1), generator=generator
    )
    x = tokens[:, :-1]
    for stage, _ in pipeline:
        x = stage(x)
    loss_fn(x, tokens[:, 1:]).backward()
    for _, optimizer in pipeline:
        optimizer.step()
        optimizer.zero_grad()


def weights(pipeline: list[tuple[Stage, torch.optim.Optimizer]]) -> dict[str, torch.Tensor]:
    return {
        model_wide(name, stage.layers): tensor
        for stage, _ in pipeline
        for name, tensor in stage.state_dict().items()
    }


def moments(pipeline: list[tuple[Stage, torch.optim.Optimizer]]) -> dict[str, torch.Tensor]:
    found = {}
    for stage, optimizer in pipeline:
        names = {id(p): model_wide(n, stage.layers) for n, p in stage.named_parameters()}
        for param, state in optimizer.state.items():
            found[names[id(param)]] = torch.cat(
                [state["exp_avg"].ravel(), state["exp_avg_sq"].ravel()]
            )
    return found


class NoTransport:
    """restore_stage never fetches here: every source state is in the directory."""

    peer_id = "a"


@pytest.mark.parametrize("new_layers", [(3, 1), (1, 3)])
def test_a_new_split_is_built_from_the_old_stages_states(
    tmp_path: Path, new_layers: tuple[int, ...]
) -> None:
    old_plan, new_plan = plan((), 1), plan(new_layers, 2)
    old = chain(old_plan.layer_ranges(SPEC.model.n_layer))  # L0-2, L2-4
    for step in range(2):
        train_step(old, step)
    for stage, optimizer in old:
        record_step(tmp_path, SPEC, stage, StageSnapshot.take(stage, optimizer, 2))

    members, placed = placement(new_plan, SPEC.model.n_layer)
    held = {"a": usable(own_announcement(tmp_path, new_plan.state_rank), new_plan.state_rank)}
    start = choose_start_step(list(placed), held, placed, members)
    assert start.step == 2 and start.note == ""
    assert set(start.sources) == set(placed)  # neither new stage was ever saved

    new = chain(new_plan.layer_ranges(SPEC.model.n_layer))
    for stage, optimizer in new:
        step = restore_stage(SPEC, new_plan, NoTransport(), tmp_path, stage, optimizer, start).step  # type: ignore[arg-type]
        assert step == 2
    old_weights, new_weights = weights(old), weights(new)
    assert old_weights.keys() == new_weights.keys()
    assert all(torch.equal(old_weights[n], new_weights[n]) for n in old_weights)
    old_moments, new_moments = moments(old), moments(new)
    assert old_moments.keys() == new_moments.keys() == {n for n in old_weights}
    assert all(torch.equal(old_moments[n], new_moments[n]) for n in old_moments)
    # the built stages were saved: the next plan finds them under their own names
    keys = {s.key for s in list_states(tmp_path) if s.step == 2}
    assert keys == {"L0-2", "L2-4"} | set(placed)

    # and training goes on exactly as it would have under the old cut
    train_step(old, 2)
    train_step(new, 2)
    old_weights, new_weights = weights(old), weights(new)
    assert all(torch.equal(old_weights[n], new_weights[n]) for n in old_weights)


def test_a_stage_whose_other_blocks_were_lost_keeps_the_blocks_that_were_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The one holder of L2-4 was killed, no copy: its survivor alone gets the whole model
    (one stage, L0-4). It resumes at its own step with its trained blocks and the lost ones
    from initial weights, loudly; it used to restart the whole run from step 0, and its saves
    from 0 on then pruned the trained L0-2 away."""
    old = chain(plan((), 1).layer_ranges(SPEC.model.n_layer))  # L0-2, L2-4
    for step in range(3):
        train_step(old, step)
    first, _ = old[0]
    record_step(tmp_path, SPEC, first, StageSnapshot.take(first, old[0][1], 3))  # L0-2 only

    alone = Plan(term=1, epoch=2, planner="P", stages=1, pipelines=(("a",),), spares=(),
                 data_addrs={}, cost_s=0.0)  # fmt: skip
    members, placed = placement(alone, SPEC.model.n_layer)
    held = {"a": usable(own_announcement(tmp_path, alone.state_rank), alone.state_rank)}
    start = choose_start_step(list(placed), held, placed, members)
    assert (start.step, start.sources, start.fresh) == (3, {"L0-4": ("L0-2",)}, {"L0-4": (2, 3)})
    assert "blocks 2, 3 of L0-4" in start.note

    (stage, optimizer), initial = chain([range(4)])[0], weights(chain([range(4)]))
    with caplog.at_level("INFO"):
        restored = restore_stage(SPEC, alone, NoTransport(), tmp_path, stage, optimizer, start)  # type: ignore[arg-type]
    assert restored.step == 3 and not restored.lost
    assert "from initial weights" in caplog.text
    trained, now = weights(old), weights([(stage, optimizer)])
    for name, tensor in now.items():
        kept = name.startswith(("embed", "block0.", "block1."))
        assert torch.equal(tensor, trained[name] if kept else initial[name]), name
    assert set(moments([(stage, optimizer)])) == {
        n for n in now if n.startswith(("embed", "block0.", "block1."))
    }
