"""`p2ptrain checkpoints list|prune` (issue 30): states by lineage; prune keeps the newest steps
of every lineage, and with --dry-run deletes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.app import main
from p2ptrain.train.checkpoint import list_states
from tests.worker.resume.test_adopt import plan, root, save_swarm


def test_list_names_each_lineage_and_prune_keeps_the_newest_of_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = plan((), 1, root()), plan((), 1, root())
    save_swarm(tmp_path, first, range(6))  # the writer keeps steps 3..6 of its own lineage
    save_swarm(tmp_path, second, range(6, 8))  # steps 7, 8
    argv = ["checkpoints", "--checkpoint-dir", str(tmp_path)]
    assert main([*argv[:1], "list", *argv[1:]]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"lineage {second.lineage[0][0]}: newest step 8")
    assert lines[1].startswith(f"lineage {first.lineage[0][0]}: newest step 6")
    assert "steps 3, 4, 5, 6" in lines[1] and "stages L0-2, L2-4" in lines[1]

    before = {s.path for s in list_states(tmp_path)}
    assert main([*argv[:1], "prune", *argv[1:], "--keep", "1", "--dry-run"]) == 0
    assert "8 files would go" in capsys.readouterr().out
    assert {s.path for s in list_states(tmp_path)} == before
    assert main([*argv[:1], "prune", *argv[1:], "--keep", "1"]) == 0
    left = {(s.tag.rpartition("-e")[0] if s.tag else "", s.step) for s in list_states(tmp_path)}
    assert left == {(first.lineage[0][0], 6), (second.lineage[0][0], 8)}
    assert main([*argv[:1], "prune", *argv[1:], "--keep", "0"]) == 2  # the newest always stays


def test_a_corrupt_state_is_neither_counted_nor_kept_in_place_of_a_good_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file named as a newer state but holding junk was counted as the lineage's newest: a
    `prune --keep 1` deleted the only loadable state and kept the junk."""
    first = plan((), 1, root())
    save_swarm(tmp_path, first, range(3))
    good = {s.path for s in list_states(tmp_path)}
    junk = tmp_path / f"stage-L0-2.step9.{first.state_tag}.pt"
    junk.write_bytes(b"junk")
    argv = ["checkpoints", "prune", "--checkpoint-dir", str(tmp_path), "--keep", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"not a stage state (left as it is): {junk}" in out
    left = list_states(tmp_path)
    assert junk in {s.path for s in left}  # not ours to judge further: the operator sees it
    assert {(s.key, s.step) for s in left if s.path != junk} == {("L0-2", 3), ("L2-4", 3)}
    assert {s.path for s in left} - {junk} <= good
    assert main(["checkpoints", "list", "--checkpoint-dir", str(tmp_path)]) == 0
    assert "newest step 3" in capsys.readouterr().out


def test_a_missing_or_wrong_directory_is_an_error(tmp_path: Path) -> None:
    assert main(["checkpoints", "list", "--checkpoint-dir", str(tmp_path / "nope")]) == 2
    (tmp_path / "a.json").write_text("{}")
    assert main(["checkpoints", "prune", "--checkpoint-dir", str(tmp_path / "a.json")]) == 2


def test_prunes_flags_given_to_list_are_an_error(tmp_path: Path) -> None:
    """`list --keep 1 --dry-run` listed, and an operator may have thought it pruned."""
    assert main(["checkpoints", "list", "--checkpoint-dir", str(tmp_path), "--keep", "1"]) == 2
