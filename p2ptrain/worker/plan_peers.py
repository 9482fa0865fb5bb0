"""A session's links to its plan's peers: dialled on the data plane, then let into the DHT."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from p2ptrain.records import Plan
from p2ptrain.worker.dht_gate import admit_plan_peers
from p2ptrain.worker.dht_helpers import bootstrap_dht
from p2ptrain.worker.pipeline.link_bounds import dial_window_s

if TYPE_CHECKING:
    from hivemind import DHT

    from p2ptrain.worker.pipeline.transport import Transport

log = logging.getLogger("p2ptrain.worker")


def connect_to_plan_peers(
    plan: Plan, dht: DHT, transport: Transport, superseded: Callable[[], bool]
) -> None:
    """Dial every other peer of `plan` (each within its link's window) until `superseded`
    says a newer plan or a stop is here; then the DHT serves them, and only them."""
    addrs = plan.data_addrs
    me = transport.peer_id
    others = plan.peers() - {me}
    windows = {p: dial_window_s(plan.link_facts(me, p)) for p in others}
    unreachable = transport.connect_all(  # a newer plan or a stop ends the dials
        {p: addrs[p] for p in sorted(others) if addrs.get(p)}, windows, superseded
    )
    if unreachable:
        log.warning("not connected to %s yet: going on (they may dial us)", unreachable)
    admit_plan_peers(dht, plan.peers())  # the DHT serves them only (worker/dht_gate.py)
    if others:  # the DHT carries resume announcements and averaging matchmaking
        bootstrap_dht(dht, sorted(others))
