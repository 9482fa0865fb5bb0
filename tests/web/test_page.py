"""The dashboard page in a real browser (headless Chromium), fed synthetic status documents."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from p2ptrain.web.server import Dashboard, DashboardServer
from tests.web.browser import headless_chromium, needs_browser, plan_grid, read_page
from tests.web.synthetic import peer_ids, swarm

pytestmark = needs_browser


def wait_for(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def renders(driver: Any) -> int:
    return int(driver.execute_script("return window.p2ptrainRenders || 0"))


def test_64_peers_render_fast_and_the_page_stays_responsive(
    served: tuple[DashboardServer, Dashboard],
) -> None:
    server, dashboard = served
    status = swarm(64)
    dashboard.update(status, time.time())
    with headless_chromium() as driver:
        driver.get(server.url)
        assert wait_for(lambda: renders(driver) >= 3), "the page did not render three times"
        rows = read_page(driver, "#peers tbody tr", "data-peer")
        assert rows == [p.id for p in status.peers]
        reach = read_page(driver, "#peers tbody td:nth-child(3)")  # the reachability column
        assert reach == [p.reachability for p in status.peers] and "private" in reach
        grid = plan_grid(driver)
        assert len(grid) == 16 and all(len(row) == 4 for row in grid)
        heat = driver.find_element("id", "heat")
        assert heat.get_attribute("data-peers") == "64"
        # the plan's links: 16 pipelines x 3 hops + 4 stages x C(16, 2) group pairs
        assert heat.get_attribute("data-plan-links") == str(16 * 3 + 4 * 120)
        render_ms = driver.execute_script("return window.p2ptrainRenderMs")
        assert render_ms < 250, f"one render of 64 peers took {render_ms:.0f} ms"
        # responsive: a script answers at once while the page keeps polling, and a control works
        started = time.monotonic()
        driver.execute_script("return 1")
        assert time.monotonic() - started < 1.0
        before = renders(driver)
        driver.find_element("css selector", "#link-metric option[value=rate]").click()
        assert renders(driver) > before  # re-rendered on the change, synchronously


def test_the_loss_curve_gains_points_and_events_appear(
    served: tuple[DashboardServer, Dashboard],
) -> None:
    server, dashboard = served
    ids = peer_ids(8)
    dashboard.update(swarm(8, ids=ids, step=1), time.time())
    with headless_chromium() as driver:
        driver.get(server.url)

        def points() -> int:
            value = driver.execute_script(
                "const s = document.querySelector('#loss svg'); return s ? s.dataset.points : '0'"
            )
            return int(value)

        assert wait_for(lambda: points() == 1)
        for step in (2, 3, 4):
            dashboard.update(swarm(8, ids=ids, step=step), time.time())
        assert wait_for(lambda: points() == 4)
        dashboard.update(swarm(8, ids=ids, step=5, dead=frozenset({ids[2]})), time.time())
        assert wait_for(lambda: "stopped answering" in "".join(read_page(driver, "#events")))
        assert read_page(driver, "#peers tbody tr.dead", "data-peer") == [ids[2]]
        assert "2 × 4" in "".join(read_page(driver, "#events"))
