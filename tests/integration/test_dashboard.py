"""The dashboard of a real local swarm (`p2ptrain local --http`), in headless Chromium: every
peer listed, the plan grid of the right shape, the loss curve gaining points as the swarm trains,
and /metrics read with Prometheus' own parser."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.web.browser import headless_chromium, needs_browser, plan_grid, read_page
from tests.web.test_page import wait_for

pytestmark = [pytest.mark.integration, needs_browser]

RUN = """
[run]
run_id = "dashboard-test"
compute_aware = false  # the plan's shape is checked: timing noise must not change it
stages = 2
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
steps = 150
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


def test_the_page_of_a_training_swarm(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    port = _free_port()
    base = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "p2ptrain",
            "local",
            "--peers",
            "4",
            "--run",
            str(run),
            "--http",
            str(port),
            "--workdir",
            str(tmp_path / "work"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def status() -> dict | None:
            try:
                doc = _get_json(base + "api/status")
            except OSError:
                return None
            return doc if isinstance(doc, dict) else None

        def planned() -> dict | None:
            doc = status()
            return doc if doc and doc["plan"] and len(doc["peers"]) == 4 else None

        doc = wait_for(planned, timeout_s=180)
        assert doc, "no plan of 4 peers on the dashboard's status"
        plan = doc["plan"]
        with headless_chromium() as driver:
            driver.get(base)
            assert wait_for(lambda: driver.execute_script("return window.p2ptrainRenders || 0"))
            rows = read_page(driver, "#peers tbody tr", "data-peer")
            assert sorted(rows) == sorted(p["id"] for p in doc["peers"])

            def page_shows_the_plan() -> bool:
                # the page against the status of the same moment: on a loaded box the planner
                # may re-plan (a slow worker planned around) between two reads
                now = status()
                grid = plan_grid(driver)
                return bool(now and now["plan"] and grid == now["plan"]["pipelines"])

            assert wait_for(page_shows_the_plan, timeout_s=30), (plan_grid(driver), status())
            assert all(len(row) == plan["stages"] == 2 for row in plan_grid(driver))

            def points() -> int:
                found = driver.execute_script(
                    "const s = document.querySelector('#loss svg'); return s ? s.dataset.points : '0'"
                )
                return int(found)

            first = wait_for(lambda: points() >= 2, timeout_s=120)
            assert first, "the loss curve has no points"
            seen = points()
            assert wait_for(lambda: points() >= seen + 3, timeout_s=120), "the curve stopped"
            assert "plan" in "".join(read_page(driver, "#events"))
        with urllib.request.urlopen(base + "metrics", timeout=5) as reply:
            families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
        alive = {s.labels["state"]: s.value for s in families["p2ptrain_peers"].samples}
        assert alive["alive"] == 4
        assert families["p2ptrain_step"].samples[0].value >= 1
        outcomes = {s.labels["outcome"] for s in families["p2ptrain_averaging_rounds"].samples}
        assert "averaged" in outcomes
        planes = {s.labels["plane"] for s in families["p2ptrain_sent_bytes"].samples}
        assert planes == {"data", "control"}
        assert families["p2ptrain_link_rtt_seconds"].samples
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
        try:
            out = proc.communicate(timeout=60)[0].decode()
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out = proc.communicate()[0].decode()
    assert "dashboard: " + base in out, out[-2000:]
