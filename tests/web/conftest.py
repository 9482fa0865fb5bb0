"""A dashboard served on a free loopback port, for the page and server tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from p2ptrain.web.server import Dashboard, DashboardServer


@pytest.fixture
def served() -> Iterator[tuple[DashboardServer, Dashboard]]:
    dashboard = Dashboard()
    server = DashboardServer(dashboard, "127.0.0.1", 0)
    server.start()
    try:
        yield server, dashboard
    finally:
        server.stop()
