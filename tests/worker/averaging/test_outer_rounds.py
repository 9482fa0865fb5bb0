"""DiLoCo's outer rounds in the worker (worker/averaging/outer_rounds.py), without a network: the
staggered schedule, a one-replica stage's outer step, and the outer state carried by a stage's
checkpoint (safetensors: train/state_file.py) and by a re-cut (train/recut.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2ptrain.control.progress import progress_line
from p2ptrain.errors import WireError
from p2ptrain.records import MetricsReport
from p2ptrain.records.run import RunSpec
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_read import load_stage, read_state
from p2ptrain.train.model import Stage, build_layers, loss_fn
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.recut import assemble
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker.averaging.outer_rounds import OuterRounds, due

SPEC = RunSpec().replace(
    n_layer=2, n_head=2, n_embd=16, block_size=8, steps=12, seed=3, sync="diloco", inner_steps=4
)


def inner_step(stage: Stage, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """One AdamW step of a whole-model stage on random tokens."""
    tokens = torch.randint(
        0,
        SPEC.model.vocab_size,
        (2, SPEC.model.block_size + 1),
        generator=torch.Generator().manual_seed(seed),
    )
    loss_fn(stage(tokens[:, :-1]), tokens[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad()


def flat(stage: Stage) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in stage.parameters()])


def test_stages_sync_at_staggered_steps_and_all_after_the_last() -> None:
    starts = [[s for s in range(SPEC.optim.steps) if due(SPEC, stage, 2, s)] for stage in (0, 1)]
    # H = 4: stage 1 half a period later, its first round after the first period too
    assert starts == [[3, 7, 11], [5, 9, 11]]
    assert [s for s in range(12) if due(SPEC.replace(inner_steps=5), 0, 1, s)] == [4, 9, 11]


def test_a_one_replica_stage_applies_its_own_pseudo_gradient() -> None:
    stage = build_layers(SPEC, range(0, 2))
    optimizer = make_optimizer(stage, SPEC)
    rounds = OuterRounds(SPEC, 0, 1, stage, open_averager=None)
    start = flat(stage).clone()
    for step in range(3):
        inner_step(stage, optimizer, step)
        assert rounds.after_step(step, lambda: False) is None
    inner_step(stage, optimizer, 3)
    delta = start - flat(stage)
    report = rounds.after_step(3, lambda: False)
    assert report is not None and report.kind == "solo" and rounds.outer_steps == 1
    # from zero momentum: anchor - lr * (delta + momentum * delta); the parameters are the anchor
    expected = start - SPEC.optim.outer_lr * (1 + SPEC.optim.outer_momentum) * delta
    torch.testing.assert_close(rounds.outer.anchor, expected)
    torch.testing.assert_close(flat(stage), expected)


def test_a_one_replica_stages_fragments_step_their_own_slices_at_their_own_phases() -> None:
    spec = SPEC.replace(outer_fragments=2)  # H 4: fragment 0 after steps 3, 7; 1 after 5, 9
    stage = build_layers(spec, range(0, 2))
    optimizer = make_optimizer(stage, spec)
    rounds = OuterRounds(spec, 0, 1, stage, open_averager=None)
    (a, b), (c, d) = rounds.spans
    assert (a, d) == (0, rounds.outer.numel) and b == c
    start = flat(stage).clone()
    reports = {}
    for step in range(6):
        inner_step(stage, optimizer, step)
        before = flat(stage).clone()
        reports[step] = rounds.after_step(step, lambda: False)
    assert [s for s, r in reports.items() if r is not None] == [3, 5]
    assert all(r is None or r.kind == "solo" for r in reports.values())
    after = flat(stage)
    assert torch.equal(after[a:b], before[a:b])  # fragment 0: not its turn, inner progress kept
    # fragment 1's first round: from its anchor (the start) and zero momentum
    delta = start[c:d] - before[c:d]
    factor = spec.optim.outer_lr * (1 + spec.optim.outer_momentum)
    torch.testing.assert_close(after[c:d], start[c:d] - factor * delta)
    assert rounds.outer_steps == 1  # the count follows fragment 0 (its round after step 3)


def _trained_stage(layers: range, steps: int) -> tuple[Stage, torch.optim.Optimizer, OuterRounds]:
    stage = build_layers(SPEC, layers)
    optimizer = make_optimizer(stage, SPEC)
    rounds = OuterRounds(SPEC, 0, 1, stage, open_averager=None)
    for step in range(steps):  # one outer step (after step 3), then inner progress past it
        _partial_step(stage, optimizer, step)
        rounds.after_step(step, lambda: False)
    return stage, optimizer, rounds


def _partial_step(stage: Stage, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """An AdamW step of any stage: a random loss on its parameters."""
    generator = torch.Generator().manual_seed(seed)
    loss = sum((p * torch.randn(p.shape, generator=generator)).sum() for p in stage.parameters())
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_the_outer_state_survives_a_checkpoint_round_trip(tmp_path: Path) -> None:
    stage, optimizer, rounds = _trained_stage(range(0, 2), 6)
    assert rounds.outer_steps == 1 and not torch.equal(flat(stage), rounds.outer.anchor)
    snapshot = StageSnapshot.take(stage, optimizer, 6, rounds.state_tensors())
    record_step(tmp_path, SPEC, stage, snapshot)
    path = tmp_path / "stage-L0-2.step6.pt"
    # a resumed (or joining) peer: fresh stage, optimizer and outer rounds, then the file
    other = build_layers(SPEC, range(0, 2))
    other_optimizer = make_optimizer(other, SPEC)
    saved: dict[str, torch.Tensor] = {}
    assert load_stage(path, SPEC, other, other_optimizer, saved) == 6
    other_rounds = OuterRounds(SPEC, 0, 1, other, open_averager=None)
    other_rounds.take_saved(saved)
    torch.testing.assert_close(other_rounds.outer.anchor, rounds.outer.anchor, rtol=0, atol=0)
    torch.testing.assert_close(
        other_rounds.outer.momentum_buffer, rounds.outer.momentum_buffer, rtol=0, atol=0
    )
    assert other_rounds.outer_steps == 1
    torch.testing.assert_close(flat(other), flat(stage), rtol=0, atol=0)  # inner progress kept
    # the next round continues exactly as the original's
    for step in (6, 7):
        for s, o, r in ((stage, optimizer, rounds), (other, other_optimizer, other_rounds)):
            _partial_step(s, o, step)
            r.after_step(step, lambda: False)
    assert rounds.outer_steps == other_rounds.outer_steps == 2
    torch.testing.assert_close(flat(other), flat(stage), rtol=0, atol=0)
    # under sync = "step" the file has no outer tensors: the state stays what it was
    assert state_file.read(path)["outer_state"].keys() == saved.keys()


def test_a_recut_carries_the_outer_state(tmp_path: Path) -> None:
    parts = [_trained_stage(layers, 5) for layers in (range(0, 1), range(1, 2))]
    sources = []
    for stage, optimizer, rounds in parts:
        record_step(
            tmp_path, SPEC, stage, StageSnapshot.take(stage, optimizer, 5, rounds.state_tensors())
        )
        path = tmp_path / f"stage-L{stage.layers.start}-{stage.layers.stop}.step5.pt"
        sources.append((stage.layers, read_state(path, SPEC, stage.layers)))
    whole = build_layers(SPEC, range(0, 2))
    outer = assemble(SPEC, whole, make_optimizer(whole, SPEC), sources)
    rounds = OuterRounds(SPEC, 0, 1, whole, open_averager=None)
    rounds.take_saved(outer)
    anchors = torch.cat([r.outer.anchor for _, _, r in parts])
    momenta = torch.cat([r.outer.momentum_buffer for _, _, r in parts])
    # the whole model's parameters in order: embed, block 0 (stage L0-1), block 1, head (L1-2)
    torch.testing.assert_close(rounds.outer.anchor.sort().values, anchors.sort().values)
    torch.testing.assert_close(rounds.outer.momentum_buffer.sort().values, momenta.sort().values)
    assert rounds.outer_steps == 1


def test_a_state_file_refuses_a_foreign_outer_tensor(tmp_path: Path) -> None:
    stage, optimizer, rounds = _trained_stage(range(0, 2), 1)
    record_step(tmp_path, SPEC, stage, StageSnapshot.take(stage, optimizer, 1))
    path = tmp_path / "stage-L0-2.step1.pt"
    state = state_file.read(path)
    assert state["outer_state"] == {}
    import safetensors.torch

    tensors = safetensors.torch.load_file(str(path))
    meta = safetensors.safe_open(str(path), "pt").metadata()
    tensors["outer/evil"] = torch.zeros(1)
    safetensors.torch.save_file(tensors, str(path), metadata=meta)
    with pytest.raises(WireError):
        state_file.read(path)
    # an outer state of the wrong shape is refused when taken, and the anchor stays
    bad = {**rounds.state_tensors()}
    name = next(k for k in bad if k.startswith("outer/anchor/"))
    bad[name] = torch.zeros(3)
    before = rounds.outer.anchor.clone()
    rounds.take_saved(bad)
    torch.testing.assert_close(rounds.outer.anchor, before, rtol=0, atol=0)


def test_the_progress_line_shows_outer_rounds() -> None:
    report = MetricsReport(
        step=7,
        loss=4.2,
        tokens_per_s=100.0,
        stage=1,
        replica=0,
        samples=8,
        averaging="solo",
        step_s=0.1,
        epoch=1,
        term=1,
        num_replicas=2,
        group_size=2,
        outer_steps=2,
        inner_steps=20,
        outer_round="averaged",
    )
    assert "outer 2 (H 20) avg ok (stage 1: 2 peers)" in progress_line(report)
    again = MetricsReport.from_dict(report.to_dict())
    assert again == report
    between = MetricsReport.from_dict({**report.to_dict(), "outer_round": ""})
    assert "outer 2 (H 20)  plan" in progress_line(between)
    with pytest.raises(WireError):
        MetricsReport.from_dict({**report.to_dict(), "outer_round": "evil"})


ON_THE_GPU = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
)


@pytest.mark.parametrize("device", ["cpu", ON_THE_GPU])
@pytest.mark.parametrize("codec", ["fp16", "int8", "topk"])
def test_a_stage_resumed_from_its_file_runs_its_outer_rounds_on_its_device(
    tmp_path: Path, device: str, codec: str
) -> None:
    """A file is read onto the CPU; a stage on a GPU resumed from it must still run its rounds
    (its anchor and momentum once stayed on the CPU, and a lone replica's top-k residual
    was on the CPU: the first round raised there)."""
    spec = SPEC.replace(outer_compression=codec)
    stage, optimizer, rounds = _trained_stage(range(0, 2), 6)
    record_step(
        tmp_path, spec, stage, StageSnapshot.take(stage, optimizer, 6, rounds.state_tensors())
    )
    resumed = build_layers(spec, range(0, 2)).to(device)
    resumed_optimizer = make_optimizer(resumed, spec)
    saved: dict[str, torch.Tensor] = {}
    assert (
        load_stage(tmp_path / "stage-L0-2.step6.pt", spec, resumed, resumed_optimizer, saved) == 6
    )
    resumed_rounds = OuterRounds(spec, 0, 1, resumed, open_averager=None)
    resumed_rounds.take_saved(saved)
    assert resumed_rounds.outer.anchor.device == next(resumed.parameters()).device
    reports = []
    for step in (6, 7):  # the round after step 7 (H 4)
        generator = torch.Generator().manual_seed(step)
        loss = sum(
            (p * torch.randn(p.shape, generator=generator).to(device)).sum()
            for p in resumed.parameters()
        )
        assert isinstance(loss, torch.Tensor)
        loss.backward()
        resumed_optimizer.step()
        resumed_optimizer.zero_grad()
        reports.append(resumed_rounds.after_step(step, lambda: False))
    assert reports[0] is None and reports[1] is not None and reports[1].kind == "solo"
    assert resumed_rounds.outer_steps == 2
    assert bool(torch.isfinite(resumed_rounds.outer.anchor).all())
