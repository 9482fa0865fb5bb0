import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import KEEP_STEPS, record_step, save_stage
from p2ptrain.train.checkpoint_folder import (
    DEAD_WRITER_AGE_S,
    STALE_AGE_S,
    checkpoint_path,
    layers_key,
    list_states,
    saved_steps,
    stamped_path,
    sweep_unfinished,
)
from p2ptrain.train.checkpoint_read import (
    PICKLED_OPTIMIZER_FORMAT,
    PICKLED_WEIGHTS_FORMAT,
    load_stage,
    read_file,
)
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10)


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


def test_history_keeps_the_newest_steps_and_links_the_latest(tmp_path: Path) -> None:
    model, optimizer = _trained_stage(0)
    for step in range(1, 7):
        snapshot = StageSnapshot.take(model, optimizer, step)  # type: ignore[arg-type]
        record_step(tmp_path, SPEC, model, snapshot)  # type: ignore[arg-type]
    # an older state written after a newer one (close() saves one step back) keeps latest
    record_step(tmp_path, SPEC, model, StageSnapshot.take(model, optimizer, 5))  # type: ignore[arg-type]
    key = layers_key(model.layers)  # type: ignore[arg-type]
    assert saved_steps(tmp_path) == {key: list(range(7 - KEEP_STEPS, 7))}
    latest = checkpoint_path(tmp_path, model.layers)  # type: ignore[arg-type]
    assert read_file(latest)["step"] == 6
    fresh = build_stage(SPEC, 0, 2)
    path = stamped_path(tmp_path, model.layers, 4)  # type: ignore[arg-type]
    assert load_stage(path, SPEC, fresh, make_optimizer(fresh, SPEC)) == 4


def test_a_new_lineage_prunes_its_ancestors_old_states_and_keeps_other_lineages(
    tmp_path: Path,
) -> None:
    """A new term's lineage goes on from its parent's states: together they keep KEEP_STEPS
    steps (every planner change used to leave the parent's files behind for good); another
    lineage (an earlier swarm's, a partition's other half) is not the writer's to delete."""
    model, optimizer = _trained_stage(0)
    parent, child, other = (f"{c * 16}-e1" for c in "abc")

    def write(step: int, tag: str, usable: tuple[str, ...]) -> None:
        snapshot = StageSnapshot.take(model, optimizer, step)  # type: ignore[arg-type]
        record_step(tmp_path, SPEC, model, snapshot, tag, lambda t: t in usable)  # type: ignore[arg-type]

    for step in range(1, 5):
        write(step, parent, (parent,))
        write(step, other, (other,))
    write(5, child, (parent, child))
    assert _steps_by_tag(tmp_path) == {parent: [2, 3, 4], other: [1, 2, 3, 4], child: [5]}
    for step in range(6, 9):
        write(step, child, (parent, child))
    assert _steps_by_tag(tmp_path) == {other: [1, 2, 3, 4], child: [5, 6, 7, 8]}


def test_a_lineage_that_restarted_below_its_ancestors_states_keeps_what_it_writes(
    tmp_path: Path,
) -> None:
    """Stages that shared no step restart at the older one (worker/resume/start_step.py): the
    new lineage writes steps below its parent's newest, which stay until it passes them, and
    never prune the state just written."""
    model, optimizer = _trained_stage(0)
    parent, child = (f"{c * 16}-e1" for c in "ab")

    def write(step: int, tag: str, usable: tuple[str, ...]) -> None:
        snapshot = StageSnapshot.take(model, optimizer, step)  # type: ignore[arg-type]
        record_step(tmp_path, SPEC, model, snapshot, tag, lambda t: t in usable)  # type: ignore[arg-type]

    for step in range(95, 101):
        write(step, parent, (parent,))
    for step in range(81, 84):
        write(step, child, (parent, child))
    assert _steps_by_tag(tmp_path) == {parent: [97, 98, 99, 100], child: [81, 82, 83]}


def test_a_later_epoch_below_its_lineages_earlier_steps_keeps_what_it_writes(
    tmp_path: Path,
) -> None:
    """One lineage, a later plan that starts below the steps an earlier one reached (a replica
    that rejoined: the stage-mates' common step): each new state stays, the earlier epoch's
    higher steps go first (pruned by step alone, every new state was deleted as written)."""
    model, optimizer = _trained_stage(0)
    earlier, later = "a" * 16 + "-e2", "a" * 16 + "-e4"

    def write(step: int, tag: str) -> None:
        snapshot = StageSnapshot.take(model, optimizer, step)  # type: ignore[arg-type]
        record_step(tmp_path, SPEC, model, snapshot, tag)  # type: ignore[arg-type]

    for step in (40, 45, 50, 54):
        write(step, earlier)
    write(25, later)
    assert _steps_by_tag(tmp_path) == {earlier: [45, 50, 54], later: [25]}
    for step in (30, 35, 40):
        write(step, later)
    assert _steps_by_tag(tmp_path) == {later: [25, 30, 35, 40]}
    # the latest file follows what is written (it stayed on the earlier epoch's step 54, which
    # pruning deleted)
    latest = checkpoint_path(tmp_path, model.layers)
    assert latest.samefile(stamped_path(tmp_path, model.layers, 40, later))


def _steps_by_tag(directory: Path) -> dict[str | None, list[int]]:
    found: dict[str | None, list[int]] = {}
    for state in sorted(list_states(directory), key=lambda s: s.step):
        found.setdefault(state.tag, []).append(state.step)
    return found


def test_a_snapshot_does_not_follow_later_updates() -> None:
    model, optimizer = _trained_stage(1)
    snapshot = StageSnapshot.take(model, optimizer, 3)  # type: ignore[arg-type]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for name, tensor in snapshot.model_state.items():
        assert torch.equal(tensor, before[name])


LLAMA = RunSpec().replace(model="llama", preset="tiny", block_size=8, steps=10)


def test_a_llama_stage_round_trips_and_is_refused_by_a_nanogpt_run(tmp_path: Path) -> None:
    model = build_stage(LLAMA, 1, 2)
    optimizer = make_optimizer(model, LLAMA)
    model(torch.randn(2, 8, 64)).pow(2).mean().backward()
    optimizer.step()
    path = checkpoint_path(tmp_path, model.layers)
    save_stage(path, LLAMA, model, optimizer, step=5)
    fresh = build_stage(LLAMA, 1, 2)
    fresh_opt = make_optimizer(fresh, LLAMA)
    assert load_stage(path, LLAMA, fresh, fresh_opt) == 5
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for a, b in zip(optimizer.state.values(), fresh_opt.state.values(), strict=True):
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    nanogpt = RunSpec().replace(n_layer=2, n_head=4, n_embd=64, block_size=8, steps=10)
    with pytest.raises(UserError, match="model"):
        load_stage(path, nanogpt, build_stage(nanogpt, 1, 2))
    with pytest.raises(UserError, match="model"):
        other = LLAMA.replace(num_key_value_heads=4)
        load_stage(path, other, build_stage(other, 1, 2))


def test_a_checkpoint_of_the_pickled_optimizer_format_still_loads_from_local_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Format /2 (weights as a safetensors blob, the optimizer pickled): read locally, said."""
    model, optimizer = _trained_stage(0)
    path = tmp_path / "old2.pt"
    blob = safetensors.torch.save({n: t.contiguous() for n, t in model.state_dict().items()})
    torch.save(
        {
            "format": PICKLED_OPTIMIZER_FORMAT,
            "run_id": SPEC.run_id,
            "model": dataclasses.asdict(SPEC.model_config()),
            "layers": [0, 1],
            "step": 2,
            "weights": torch.frombuffer(bytearray(blob), dtype=torch.uint8),
            "optimizer_state": optimizer.state_dict(),
        },
        path,
    )
    fresh = build_stage(SPEC, 0, 2)
    fresh_opt = make_optimizer(fresh, SPEC)
    with caplog.at_level("WARNING"):
        assert load_stage(path, SPEC, fresh, fresh_opt) == 2
    assert "older format" in caplog.text
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_a_checkpoint_of_the_pickled_weights_format_still_loads(tmp_path: Path) -> None:
    model, optimizer = _trained_stage(1)
    path = tmp_path / "old.pt"
    torch.save(
        {
            "format": PICKLED_WEIGHTS_FORMAT,
            "run_id": SPEC.run_id,
            "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 256},
            "layers": [1, 2],
            "step": 4,
            "model_state": model.state_dict(),
            "optimizer_state": optimizer.state_dict(),
        },
        path,
    )
    fresh = build_stage(SPEC, 1, 2)
    assert load_stage(path, SPEC, fresh, make_optimizer(fresh, SPEC)) == 4
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    llama = SPEC.replace(model="llama")
    with pytest.raises(UserError, match="model"):  # the old format names nanoGPT sizes only
        load_stage(path, llama, build_stage(llama, 1, 2))


def test_torn_writes_of_gone_writers_are_swept_and_live_ones_are_kept(tmp_path: Path) -> None:
    """A SIGKILL between a state's first byte and its rename leaves a state-sized temporary
    file; the next writer of the directory deletes those whose writer is gone (after a minute
    untouched) and any untouched for an hour, never one a live writer is writing."""
    finished = subprocess.Popen(["true"])
    finished.wait()  # reaped: its pid no longer runs
    dead_pid = finished.pid
    now = time.time()

    def file(name: str, age_s: float, size: int = 100) -> Path:
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        os.utime(path, (now - age_s, now - age_s))
        return path

    dead = file(f"stage-L0-2.step20.pt.{dead_pid}.ab_c1.tmp", DEAD_WRITER_AGE_S + 5, 1000)
    dead_fetch = file(f"stage-L0-2.step8.0123456789abcdef-e2.pt.{dead_pid}.q9.part", 120)
    dead_link = file(f".stage-L0-2.pt.{dead_pid}.link", 120)
    dead_adopt = file(f".stage-L0-2.step5.0123456789abcdef-e1.pt.{dead_pid}.adopt", 120)
    live_adopt = file(f".stage-L0-2.step5.pt.{os.getpid()}.adopt", 120)
    dead_but_fresh = file(f"stage-L0-2.step21.pt.{dead_pid}.zz.tmp", 5)
    ours = file(f"stage-L2-4.step20.pt.{os.getpid()}.xy.tmp", STALE_AGE_S - 60)
    ours_stale = file(f"stage-L2-4.step16.pt.{os.getpid()}.xy.tmp", STALE_AGE_S + 60)
    old_format = file("stage-L2-4.step12.ptk3j2_x.tmp", STALE_AGE_S + 60)
    old_format_fresh = file("stage-L2-4.step13.ptk3j2_x.tmp", 120)
    state = file("stage-L0-2.step20.pt", STALE_AGE_S + 60)
    other = file("notes.tmp", STALE_AGE_S + 60)
    assert sweep_unfinished(tmp_path, now) == 1000 + 100 * 5
    for path in (dead, dead_fetch, dead_link, dead_adopt, ours_stale, old_format):
        assert not path.exists(), path.name
    for path in (dead_but_fresh, ours, live_adopt, old_format_fresh, state, other):
        assert path.exists(), path.name
    assert sweep_unfinished(tmp_path / "missing", now) == 0


def test_an_earlier_cuts_states_go_once_the_new_range_holds_its_steps(tmp_path: Path) -> None:
    """A re-plan moved the cut (4 stages of one layer, then 2 of two): the old ranges inside
    the new one go once it holds KEEP_STEPS newer steps (each re-cut left KEEP_STEPS full states
    behind for good); a range with blocks outside it, and another lineage's states, stay."""
    spec = SPEC.replace(n_layer=4)
    lineage, other = (f"{c * 16}-e1" for c in "ab")

    def write(stage: int, stages: int, step: int, tag: str) -> range:
        model = build_stage(spec, stage, stages)
        snapshot = StageSnapshot.take(model, make_optimizer(model, spec), step)
        record_step(tmp_path, spec, model, snapshot, tag, lambda t: t == tag)  # type: ignore[arg-type]
        return model.layers  # type: ignore[return-value]

    for step in range(1, 5):
        write(0, 4, step, lineage)  # L0-1
        write(2, 4, step, lineage)  # L2-3: not inside the new first stage
        write(0, 4, step, other)
    for step in range(5, 8):
        new = write(0, 2, step, lineage)  # L0-2, after the re-cut
    assert saved_steps(tmp_path)["L0-1"] == [1, 2, 3, 4]  # the new range is not 4 steps deep
    write(0, 2, 8, lineage)
    assert _steps_by_tag(tmp_path) == {lineage: [1, 2, 3, 4, 5, 6, 7, 8], other: [1, 2, 3, 4]}
    kept = {(s.key, s.tag) for s in list_states(tmp_path)}
    assert kept == {("L0-1", other), ("L2-3", lineage), ("L0-2", lineage)}
    assert (
        checkpoint_path(tmp_path, new).exists() and checkpoint_path(tmp_path, range(2, 3)).exists()
    )
    # the old range's latest link stays while another lineage's states of it do
    assert checkpoint_path(tmp_path, range(0, 1)).exists()


def test_an_earlier_cuts_latest_link_goes_with_its_last_state(tmp_path: Path) -> None:
    spec = SPEC.replace(n_layer=4)

    def write(stage: int, stages: int, step: int) -> None:
        model = build_stage(spec, stage, stages)
        snapshot = StageSnapshot.take(model, make_optimizer(model, spec), step)
        record_step(tmp_path, spec, model, snapshot)  # type: ignore[arg-type]

    for step in range(1, 3):
        write(0, 4, step)
    for step in range(3, 3 + KEEP_STEPS):
        write(0, 2, step)
    assert set(saved_steps(tmp_path)) == {"L0-2"}
    assert not checkpoint_path(tmp_path, range(0, 1)).exists()  # its bytes are freed too
