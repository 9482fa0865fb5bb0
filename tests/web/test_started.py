"""The dashboard says where each peer's session started (issue 30): "resumed from step N
(lineage ...)" in the status document it serves and as a cell of the peers table (as text)."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request

from p2ptrain.records import PeerMetrics, SwarmStatus
from p2ptrain.web.server import Dashboard, DashboardServer
from tests.web.browser import headless_chromium, needs_browser, read_page
from tests.web.synthetic import swarm

LINEAGE = "0123456789abcdef"
RESUMED = f"resumed from step 10 (lineage {LINEAGE})"


def resumed_swarm() -> SwarmStatus:
    """8 peers, all resumed at step 10 but the last, which says nothing (an older peer)."""
    status = swarm(8, step=12)
    resumed = [
        dataclasses.replace(
            peer,
            metrics=dataclasses.replace(
                peer.metrics or PeerMetrics(), start_step=10, start_lineage=LINEAGE
            ),
        )
        for peer in status.peers[:-1]
    ]
    return dataclasses.replace(status, peers=(*resumed, status.peers[-1]))


def test_the_dashboards_status_document_says_where_sessions_started(
    served: tuple[DashboardServer, Dashboard],
) -> None:
    server, dashboard = served
    dashboard.update(resumed_swarm(), time.time())
    with urllib.request.urlopen(server.url + "api/status", timeout=10) as reply:
        document = json.loads(reply.read())
    started = [p["started"] for p in document["peers"]]
    assert started == [RESUMED] * 7 + [""]
    assert all(p["metrics"]["start_step"] == 10 for p in document["peers"][:7])
    with urllib.request.urlopen(server.url, timeout=10) as reply:
        assert b"<th>started</th>" in reply.read()  # the page has the column


@needs_browser
def test_the_page_shows_where_sessions_started(served: tuple[DashboardServer, Dashboard]) -> None:
    server, dashboard = served
    dashboard.update(resumed_swarm(), time.time())
    with headless_chromium() as driver:
        driver.get(server.url)
        deadline = time.monotonic() + 20
        cells: list[str] = []
        while time.monotonic() < deadline and not cells:
            cells = read_page(driver, "#peers tbody td.started")
            time.sleep(0.1)
        assert cells == [RESUMED] * 7 + ["-"]
