"""Issue 26 (low): the status RPC built the whole status document again for every page anyone
asked for. It is built at most once a second now, and paged from that copy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from p2ptrain.control import rpcs
from p2ptrain.control import status as status_module
from p2ptrain.net.paging import cursor_request
from p2ptrain.records import SwarmStatus
from tests.web.synthetic import swarm


def test_pages_come_from_one_build_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    status = swarm(120)  # ~7,000 links: several pages of STATUS_PAGE_BYTES
    builds: list[float] = []

    def build(view: object, now: float, relay_bytes: int = 0) -> SwarmStatus:
        builds.append(now)
        return status

    clock = {"now": 100.0}
    monkeypatch.setattr(status_module.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(rpcs, "swarm_status", build)
    monkeypatch.setattr(rpcs, "STATUS_PAGE_BYTES", 64 * 1024)
    state: Any = SimpleNamespace(view=None, relay=SimpleNamespace(bytes_relayed=0))
    responder = rpcs.RpcResponder(state)

    async def fetch_all() -> dict[str, Any]:
        doc = await responder.respond_status(b"")
        cursor = doc.pop("next")
        while cursor is not None:
            page = await responder.respond_status(cursor_request(cursor))
            doc["peers"] += page["peers"]
            doc["links"] += page["links"]
            cursor = page["next"]
        return doc

    doc = trio.run(fetch_all)
    assert SwarmStatus.from_dict(doc) == status
    assert len(doc["links"]) > 5 and builds == [100.0]  # one build for all the pages
    clock["now"] = 100.5
    trio.run(fetch_all)
    assert builds == [100.0]  # still fresh
    clock["now"] = 101.2
    trio.run(fetch_all)
    assert builds == [100.0, 101.2]  # rebuilt once it is a second old
