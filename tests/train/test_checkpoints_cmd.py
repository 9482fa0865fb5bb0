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
