"""`p2ptrain export` writes each output under a temporary name and renames it into place, and a
directory it cannot write (read-only, a full disk, under a file) is a one-line error, not a
traceback; of one lineage's two epochs at one step it exports the later one's weights."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from p2ptrain.app import main
from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train import export
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.export import export_hf, merged_weights
from p2ptrain.train.model import build_model
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.recut import model_wide
from p2ptrain.train.snapshot import StageSnapshot

SPEC = RunSpec().replace(run_id="export", n_layer=2, n_head=2, n_embd=16, block_size=8, steps=2)


def save_whole(directory: Path, spec: RunSpec, tag: str | None = None) -> torch.nn.Module:
    whole = build_model(spec)
    snapshot = StageSnapshot.take(whole, make_optimizer(whole, spec), spec.optim.steps)
    record_step(directory, spec, whole, snapshot, tag)
    return whole


def test_of_two_epochs_of_one_lineage_at_one_step_the_later_is_exported(tmp_path: Path) -> None:
    lineage = "a" * 16
    save_whole(tmp_path, SPEC.replace(seed=SPEC.optim.seed + 1), f"{lineage}-e3")
    later = save_whole(tmp_path, SPEC, f"{lineage}-e4")
    merged = merged_weights(SPEC, tmp_path)
    layers = range(SPEC.model.n_layer)
    for name, tensor in later.state_dict().items():
        assert torch.equal(merged.weights[model_wide(name, layers)], tensor)


def test_a_full_disk_leaves_the_earlier_export_whole_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_whole(tmp_path, SPEC)
    out = tmp_path / "hf"
    export_hf(SPEC, tmp_path, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["config.json", "model.safetensors"]

    write_bytes = export._write_bytes

    def full(fd: int, data: bytes) -> None:
        write_bytes(fd, b"\0" * 10)  # cut short
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export, "_write_bytes", full)
    with pytest.raises(UserError) as refused:
        export_hf(SPEC, tmp_path, out)
    assert str(refused.value) == f"cannot write the export to {out}: No space left on device"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp file left


def test_an_out_directory_that_cannot_be_made_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_whole(tmp_path, SPEC)
    (tmp_path / "run.toml").write_text(SPEC.to_toml())
    (tmp_path / "a-file").write_text("")
    argv = ["export", "--run", str(tmp_path / "run.toml"), "--checkpoint-dir", str(tmp_path)]
    assert main([*argv, "--out", str(tmp_path / "a-file" / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the export to" in err
