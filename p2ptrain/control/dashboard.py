"""Feeds this node's web dashboard (p2ptrain/web): the status document once a second, or less
often where building it takes long: the build runs on the trio loop, and past a thousand peers
(or a flood of identities, each naming links) it took a second itself, every second, watched
or not; the loop now gives it at most a share (BUILD_SHARE, as the status RPC's pages).

The page and /metrics are served from the dashboard's own threads (web/server.py) and read only
what this task hands them, so serving them never touches the SwarmView.
"""

from __future__ import annotations

import logging
import time

import trio

from p2ptrain.control.status import BUILD_SHARE, swarm_status
from p2ptrain.control.view import SwarmView
from p2ptrain.web.server import Dashboard, DashboardServer, parse_http_option

log = logging.getLogger(__name__)

REFRESH_S = 1.0


class DashboardFeed:
    """The dashboard server of `--http [HOST:]PORT[,NAME...]`, listening from construction (a
    port in use fails the node's start with one line), fed by `serve`."""

    def __init__(self, http: str) -> None:
        option = parse_http_option(http)
        self.dashboard = Dashboard()
        self.server = DashboardServer(self.dashboard, option.host, option.port, option.names)

    async def serve(self, view: SwarmView) -> None:
        self.server.start()
        log.info("dashboard on %s", self.server.url)
        try:
            failing = False
            while True:
                started = time.monotonic()
                try:
                    self.dashboard.update(swarm_status(view, started), time.time())
                    failing = False
                except Exception:  # the page shows the last good snapshot; the node goes on
                    if not failing:  # once per run of failures, not once a second
                        log.exception("the dashboard could not show this status")
                    failing = True
                built_s = time.monotonic() - started
                await trio.sleep(max(REFRESH_S, BUILD_SHARE * built_s))
        finally:
            self.server.stop()
