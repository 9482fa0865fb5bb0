"""One sync partner has SYNC_PARTNER_DEADLINE_S in all (control/sync.py): a hostile responder
that answers every page just inside the RPC timeout, with a next cursor each time, held a
node's sync rounds for MAX_SYNC_PAGES x 10 s, over 20 minutes, and the next round waited on it."""

from __future__ import annotations

import json
import logging
import os
from typing import Any, cast

import pytest
import trio
import trio.testing

from p2ptrain import identity
from p2ptrain.control import sync
from p2ptrain.control.intake import Intake
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import SwarmView
from p2ptrain.net import rpc
from p2ptrain.records.replies import SyncPage

BOOT = identity.peer_id_of(bytes(range(32)))


def test_a_responder_that_stalls_every_page_is_cut_off_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seed = os.urandom(32)
    me, hostile = identity.peer_id_of(seed), identity.peer_id_of(os.urandom(32))
    view = SwarmView(
        self_id=me, role="control-only", planner_capable=False, started_at=0.0, bootstrap_id=BOOT
    )
    state = NodeState(seed, "control-only", me, cast(Any, None), view, {})
    pages = []

    async def stall_each_page(host: object, peer: object, protocol: str, request: bytes) -> Any:
        cursor = json.loads(request)["cursor"]
        pages.append(cursor)
        await trio.sleep(rpc.RPC_TIMEOUT_S - 0.1)
        return SyncPage((), cursor + 1).to_dict()

    monkeypatch.setattr(rpc, "call", stall_each_page)
    puller = sync.PullSync(state, cast(Intake, None))

    async def scenario() -> float:
        start = trio.current_time()
        await puller.sync_from(hostile)
        return trio.current_time() - start

    with caplog.at_level(logging.INFO, logger=sync.__name__):
        took_s = trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    assert took_s == pytest.approx(sync.SYNC_PARTNER_DEADLINE_S)
    assert len(pages) < sync.SYNC_PARTNER_DEADLINE_S / (rpc.RPC_TIMEOUT_S - 0.1) + 1
    assert sync.SYNC_PARTNER_DEADLINE_S < sync.MAX_SYNC_PAGES * rpc.RPC_TIMEOUT_S
    assert f"sync from {hostile} cut off" in caplog.text
