"""The dashboard shows the spares' copies of stages one peer alone holds (worker/resume/
copies.py), beside the plan's spares, as text."""

from __future__ import annotations

import dataclasses
import time

from p2ptrain.records import PeerMetrics, StageCopy, SwarmStatus
from p2ptrain.web.server import Dashboard, DashboardServer
from tests.web.browser import headless_chromium, needs_browser
from tests.web.synthetic import swarm


def copying_swarm() -> SwarmStatus:
    """One pipeline of 4 and 2 spares: the first copies stages 0 and 2 (one copy so far), the
    second stages 1 and 3."""
    status = swarm(6, stages=4)
    assert status.plan is not None
    plan = (status.plan.term, status.plan.epoch)  # made under the plan shown
    holders = [p.id for p in status.peers[:4]]
    duties = {
        status.peers[4].id: (StageCopy(0, 1, holders[0], 40), StageCopy(2, 3, holders[2])),
        status.peers[5].id: (StageCopy(1, 2, holders[1], 38), StageCopy(3, 4, holders[3], 39)),
    }
    peers = tuple(
        dataclasses.replace(p, metrics=PeerMetrics(copies=duties[p.id], copies_plan=plan))
        if p.id in duties
        else p
        for p in status.peers
    )
    return dataclasses.replace(status, peers=peers)


@needs_browser
def test_the_page_lists_each_spares_copies(served: tuple[DashboardServer, Dashboard]) -> None:
    server, dashboard = served
    status = copying_swarm()
    dashboard.update(status, time.time())
    ids = [p.id for p in status.peers]
    with headless_chromium() as driver:
        driver.get(server.url)
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline and "copies" not in text:
            text = driver.find_element("id", "spares").text
            time.sleep(0.1)
    short = [f"…{i[-8:]}" for i in ids]
    assert text == (
        f"spares: {short[4]}, {short[5]}; copies: L0-1 of {short[0]} at step 40 on {short[4]}; "
        f"L2-3 of {short[2]} none yet on {short[4]}; L1-2 of {short[1]} at step 38 on {short[5]}; "
        f"L3-4 of {short[3]} at step 39 on {short[5]}"
    )
