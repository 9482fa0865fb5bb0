"""`p2ptrain bench e2e` through the shipped path, small: a bootstrap and 4 `join` nodes in the
testbed, the live planner's plan, the JSON's per-run keys and the plot (root)."""

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
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
]


@pytest.mark.slow  # ~1 min: a bench harness (CI time); the join path is in the default suite
@pytest.mark.timeout(400)
def test_bench_e2e_trains_through_join_nodes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    before = set(list_netns())
    out, plot = tmp_path / "e2e.json", tmp_path / "e2e.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2ptrain",
            "bench",
            "e2e",
            "--peers",
            "4",
            "--stages",
            "2",
            "--steps",
            "3",
            "--runs",
            "compute_blind",
            "--cities",
            "Virginia,Ohio",
            "--json",
            "--out",
            str(out),
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads(out.read_text())
    # the paper's fixed shape (the compute-aware planner may well train one pipeline here)
    run = result["compute_blind"]
    assert run["path"] == "join" and run["term"] >= 1 and run["epoch"] >= 0
    assert run["placement"] == "scheduled" and run["compute_aware"] is False
    assert sorted(p for pipe in run["pipelines"] for p in pipe) == [0, 1, 2, 3]
    assert len(run["curve"]) == 3 and run["tokens_per_s"] > 0
    assert run["predicted_s"] > 0
    # both stage groups and both pipelines' boundaries, each way
    assert len(run["links"]) == 8
    assert all(link["predicted_bytes"] > 0 for link in run["links"])
    assert run["averaging"].get("averaged", 0) > 0
    # the bench's workers profile their steps (join --profile): the stages' CPU comes from the
    # StepProfile records beside their metrics
    compute = run["stage_compute"]
    for key in ("forward_cpu_s", "update_cpu_s", "averaging_cpu_s"):
        assert all(v is not None for row in compute[key] for v in row), (key, compute)
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert set(list_netns()) <= before
