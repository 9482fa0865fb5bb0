"""The dashboard's feed (control/dashboard.py) builds the status on the trio loop: once a second,
or BUILD_SHARE times less often than a build takes (a build of a second, every second, watched
or not, held the loop of a node in a large or flooded swarm)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from p2ptrain.control import dashboard
from p2ptrain.control.dashboard import REFRESH_S, DashboardFeed
from p2ptrain.control.status import BUILD_SHARE


class _Stop(Exception):
    pass


def test_a_slow_build_is_repeated_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    build_s = iter([0.01, 2.0, 0.01])
    sleeps: list[float] = []

    def build(view: Any, now: float) -> Any:
        clock[0] += next(build_s)
        return object()

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise _Stop

    monkeypatch.setattr(dashboard, "swarm_status", build)
    monkeypatch.setattr(dashboard.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(dashboard.trio, "sleep", sleep)
    feed = DashboardFeed("127.0.0.1:0")
    monkeypatch.setattr(feed.dashboard, "update", lambda status, now: None)
    with pytest.raises(_Stop):
        trio.run(feed.serve, None)
    assert sleeps == [REFRESH_S, pytest.approx(BUILD_SHARE * 2.0), REFRESH_S]
