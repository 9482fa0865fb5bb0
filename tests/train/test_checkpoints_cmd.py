"""`p2ptrain checkpoints list|prune` (issue 30): states by lineage; prune keeps the newest steps
of every lineage, and with --dry-run deletes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.app import main
from p2ptrain.train.checkpoint_folder import list_states
from tests.train.test_export import write_run
from tests.worker.resume.test_adopt import plan, root, save_swarm
from tests.worker.resume.test_recut import SPEC


def test_list_names_each_lineage_and_prune_keeps_the_newest_of_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = plan((), 1, root()), plan((), 1, root())
    save_swarm(tmp_path, first, range(6))  # the writer keeps steps 3..6 of its own lineage
    save_swarm(tmp_path, second, range(6, 8))  # steps 7, 8
    run = write_run(tmp_path / "run.toml", SPEC)
    argv = ["checkpoints", "--checkpoint-dir", str(tmp_path), "--run", str(run)]
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
    run = ["--run", str(write_run(tmp_path / "run.toml", SPEC))]
    argv = ["checkpoints", "prune", "--checkpoint-dir", str(tmp_path), "--keep", "1", *run]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"not a stage state (left as it is): {junk}" in out
    left = list_states(tmp_path)
    assert junk in {s.path for s in left}  # not ours to judge further: the operator sees it
    assert {(s.key, s.step) for s in left if s.path != junk} == {("L0-2", 3), ("L2-4", 3)}
    assert {s.path for s in left} - {junk} <= good
    assert main(["checkpoints", "list", "--checkpoint-dir", str(tmp_path), *run]) == 0
    assert "newest step 3" in capsys.readouterr().out


def test_a_missing_or_wrong_directory_is_an_error(tmp_path: Path) -> None:
    assert main(["checkpoints", "list", "--checkpoint-dir", str(tmp_path / "nope")]) == 2
    (tmp_path / "a.json").write_text("{}")
    assert main(["checkpoints", "prune", "--checkpoint-dir", str(tmp_path / "a.json")]) == 2


def test_prunes_flags_given_to_list_are_an_error(tmp_path: Path) -> None:
    """`list --keep 1 --dry-run` listed, and an operator may have thought it pruned."""
    assert main(["checkpoints", "list", "--checkpoint-dir", str(tmp_path), "--keep", "1"]) == 2


def test_prune_leaves_another_run_s_states_in_a_shared_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Grouped by lineage alone, `prune --run A` pruned run B's root states, its newest too."""
    ours, theirs = plan((), 1, root()), plan((), 1, root())
    other = SPEC.replace(run_id="another-run")
    save_swarm(tmp_path, ours, range(3))
    save_swarm(tmp_path, theirs, range(3, 6), other)
    save_swarm(tmp_path, plan((), 1, ()), range(6, 8), other)  # its root's: untagged
    kept = {s.path for s in list_states(tmp_path) if s.tag in (theirs.state_tag, None)}
    assert len(kept) == 10
    run = write_run(tmp_path / "run.toml", SPEC)
    argv = ["checkpoints", "prune", "--checkpoint-dir", str(tmp_path), "--run", str(run)]
    assert main([*argv, "--keep", "1"]) == 0
    out = capsys.readouterr().out
    assert "left 10 files of another run as they are (" in out and "another-run" in out
    assert "kept the newest 1 steps of each of 1 lineages" in out
    left = {s.path for s in list_states(tmp_path)}
    assert kept <= left
    assert {s.step for s in list_states(tmp_path) if s.tag == ours.state_tag} == {3}


def test_a_state_that_cannot_be_removed_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    save_swarm(tmp_path, plan((), 1, root()), range(3))
    run = write_run(tmp_path / "run.toml", SPEC)

    def read_only(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    argv = ["checkpoints", "prune", "--checkpoint-dir", str(tmp_path), "--run", str(run)]
    assert main([*argv, "--keep", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot remove" in err and "Permission denied" in err
