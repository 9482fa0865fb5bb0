"""`p2ptrain export` merges one lineage's states of one step (the one saved last where two
lineages saved it: a restarted swarm, a partition's halves) and leaves another run's files out,
saying so (issue 30)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from p2ptrain.app import main
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.export import merged_weights
from p2ptrain.train.model import Stage, build_model
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.recut import model_wide
from p2ptrain.train.snapshot import StageSnapshot
from tests.train.test_export import TINY_LLAMA, cut, write_run

OLDER, NEWER = "a" * 16, "b" * 16


def save(spec: RunSpec, whole: Stage, directory: Path, cuts: list[range], tag: str) -> None:
    for layers in cuts:
        stage = cut(spec, whole, layers)
        snapshot = StageSnapshot.take(stage, make_optimizer(stage, spec), spec.optim.steps)
        record_step(directory, spec, stage, snapshot, tag=tag)


def age(directory: Path, lineage: str, seconds_ago: float) -> None:
    for state in list_states(directory):
        if (state.tag or "").startswith(lineage):
            mtime = os.stat(state.path).st_mtime - seconds_ago
            os.utime(state.path, (mtime, mtime))


def model_wide_weights(whole: Stage) -> dict[str, torch.Tensor]:
    return {model_wide(n, whole.layers): t for n, t in whole.state_dict().items()}


def test_two_lineages_at_one_step_are_never_mixed_the_newest_is_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = TINY_LLAMA.replace(checkpoint_dir=str(tmp_path))
    older, newer = build_model(spec), build_model(spec.replace(seed=spec.optim.seed + 1))
    # the older swarm cut 1 + 1 blocks, the newer one holds both in one stage: merged by file
    # order, the older swarm's first stage would have filled block 0
    save(spec, older, tmp_path, [range(0, 1), range(1, 2)], f"{OLDER}-e1")
    save(spec, newer, tmp_path, [range(0, 2)], f"{NEWER}-e3")
    age(tmp_path, OLDER, 60.0)
    merged = merged_weights(spec, tmp_path)
    assert (merged.step, merged.lineage, merged.other_lineages) == (
        spec.optim.steps,
        NEWER,
        (OLDER,),
    )
    expected = model_wide_weights(newer)
    assert all(torch.equal(merged.weights[n], expected[n]) for n in expected)
    run = write_run(tmp_path / "run.toml", spec)
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert f"at step {spec.optim.steps} (lineage {NEWER})" in out
    assert f"also saved under lineage {OLDER}" in out


def test_the_newest_lineage_that_covers_the_model_wins(tmp_path: Path) -> None:
    spec = TINY_LLAMA
    older, newer = build_model(spec), build_model(spec.replace(seed=spec.optim.seed + 1))
    save(spec, older, tmp_path, [range(0, 1), range(1, 2)], f"{OLDER}-e1")
    save(spec, newer, tmp_path, [range(0, 1)], f"{NEWER}-e3")  # its last stage is missing
    age(tmp_path, OLDER, 60.0)
    merged = merged_weights(spec, tmp_path)
    assert merged.lineage == OLDER  # whole, never the newer swarm's half with the older's
    expected = model_wide_weights(older)
    assert all(torch.equal(merged.weights[n], expected[n]) for n in expected)


def test_another_runs_files_in_the_directory_are_skipped_with_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = TINY_LLAMA.replace(checkpoint_dir=str(tmp_path))
    other = spec.replace(run_id="another-run")
    save(other, build_model(other), tmp_path, [range(0, 1), range(1, 2)], f"{NEWER}-e1")
    # ours, of the same step and stages under the root: the other run's files are in the way
    for layers in (range(0, 1), range(1, 2)):
        stage = cut(spec, build_model(spec), layers)
        record_step(
            tmp_path,
            spec,
            stage,
            StageSnapshot.take(stage, make_optimizer(stage, spec), spec.optim.steps),
        )
    run = write_run(tmp_path / "run.toml", spec)
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert out.count("skipped stage-") == 2 and "'another-run'" in out
    assert f"at step {spec.optim.steps} (lineage root)" in out
