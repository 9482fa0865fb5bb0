"""`p2ptrain local --emulate`: bootstrap and nodes inside the WAN testbed; the control plane
measures the emulated links and plans on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain.schedule.synthetic import city_topology
from p2ptrain.testbed.netns import list_netns

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
]


def test_local_swarm_trains_inside_the_testbed(tmp_path: Path) -> None:
    topology = city_topology(4, 2, 2, seed=0, cities=["Virginia", "Ohio"])
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topology.to_json()))
    before = set(list_netns())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2ptrain",
            "local",
            "--emulate",
            str(path),
            "--steps",
            "3",
            "--json",
            "--workdir",
            str(tmp_path / "swarm"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and len(summary["loss"]) == 3
    assert summary["loss"][-1] < summary["loss"][0]
    pipelines = summary["plan"]["pipelines"]
    assert len(pipelines) == 2 and all(len(p) == 2 for p in pipelines)
    assert len({p for pipe in pipelines for p in pipe}) == 4
    # the control plane measured the emulated links (5.0 and 11.0 ms one way), not loopback
    # (~0.1 ms); its ping over a py-libp2p stream reads about 2x high here (docs/benchmarks.md)
    logs = "".join(p.read_text() for p in (tmp_path / "swarm").glob("peer-*.log"))
    published = [line for line in logs.splitlines() if "published plan" in line]
    assert published and "6 of 6 links measured" in published[-1], published
    low, high = published[-1].split("one-way delay ")[1].split(" ms")[0].split("-")
    assert float(low) > 4.0 and float(high) < 30.0, published[-1]
    assert set(list_netns()) <= before  # the testbed is gone


def test_emulate_needs_a_valid_topology(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "p2ptrain", "local", "--emulate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "format must be" in proc.stderr
