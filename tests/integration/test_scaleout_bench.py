"""`p2ptrain bench scaleout`, tiny: a step run and a diloco run of a few steps through bootstrap +
`join` nodes in the testbed; the JSON's contract, the file beside it and the plot (root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain.testbed.netns import list_netns

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
]

CONTRACT = {
    "tokens_per_s",
    "time_to_target_s",
    "dp_bytes_per_step",
    "dp_bytes_per_step_every_step",
    "placed_peers",
    "plan",
    "loss",
    "predicted_step_s",
    "worker_step_s",
}


@pytest.mark.timeout(600)
def test_bench_scaleout_runs_step_and_diloco_through_join_nodes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    before = set(list_netns())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2ptrain",
            "bench",
            "scaleout",
            "--peers",
            "4",
            "--stages",
            "2",
            "--steps",
            "4",
            "--inner-steps",
            "2",
            "--runs",
            "step,diloco",
            "--cities",
            "Virginia,Ohio",
            "--json",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == {"runs", "target_loss"}
    assert result == json.loads((tmp_path / "scaleout.json").read_text())
    assert set(result["runs"]) == {"step", "diloco"}
    for name, run in result["runs"].items():
        assert set(run) >= CONTRACT, name
        assert "error" not in run, (name, run.get("error"))
        assert len(run["loss"]) == 4 and run["tokens_per_s"] > 0
        assert 2 <= run["placed_peers"] <= 4
        assert run["worker_step_s"] and run["worker_step_s"] > 0
    # step reaches its own final (smoothed) loss, by definition
    assert result["runs"]["step"]["time_to_target_s"] is not None
    assert result["target_loss"] > 0
    assert "vs_step" in result["runs"]["diloco"]
    assert (tmp_path / "scaleout.png").read_bytes().startswith(b"\x89PNG")
    assert set(list_netns()) <= before
