"""Issue 29: a plan over gossip's 64 KiB envelope crosses a real libp2p stream
(/p2ptrain/plan/1.0.0) from a live control node into another node's view (one trio loop,
loopback)."""

from __future__ import annotations

import os
import time
from typing import Any

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.node import ControlNode, NodeConfig
from p2ptrain.control.plan_pull import PlanPull
from p2ptrain.net.host import make_host
from p2ptrain.records import RunSpec, issue_token
from tests.control.test_gossip_screen import record_body
from tests.control.test_paging import _run, serving
from tests.control.test_sync_digest import client_node


def test_a_plan_over_the_gossip_envelope_is_pulled_over_a_live_stream() -> None:
    run = RunSpec()
    server = ControlNode(
        NodeConfig(seed=os.urandom(32), role="bootstrap", run=run, print_addr=False)
    )
    organiser = server.config.seed
    planner_seed = os.urandom(32)
    planner = identity.peer_id_of(planner_seed)
    token = issue_token(organiser, planner, True, time.time() + 3600, run.run_id).encode()

    def signed(kind: str, seq: int, body: dict[str, Any]) -> bytes:
        return wire.sign(planner_seed, kind, seq, body, run_id=run.run_id)

    addrs = {planner: ["/ip4/127.0.0.1/tcp/4001"]}
    for _ in range(900):  # the data addresses of 900 more peers: ~100 kB
        addrs[identity.peer_id_of(os.urandom(32))] = ["/ip4/198.51.100.7/tcp/40001"]
    plan_body = {
        "term": 1,
        "epoch": 1,
        "planner": planner,
        "stages": 1,
        "pipelines": [[planner]],
        "spares": [],
        "data_addrs": addrs,
        "cost_s": 1.0,
    }
    messages = [
        signed("peer", 1, record_body(token)),
        signed("claim", 2, {"term": 1}),
    ]
    plan = signed("plan", 3, plan_body)
    assert len(plan) > wire.MAX_ENVELOPE_BYTES

    seed = os.urandom(32)
    client_host = make_host(seed)
    state, intake = client_node(seed, server.peer_id, run, client_host)
    view = state.view
    for node_intake in (server.intake, intake):
        for data in messages:
            env = wire.decode(data)
            assert node_intake.apply(env, data, planner, "sync", time.monotonic())
    env = wire.decode(plan)
    assert server.intake.apply(env, plan, planner, "sync", time.monotonic())
    puller = PlanPull(state, lambda: b"", intake.apply)
    outcome: list[str | None] = []

    async def scenario() -> None:
        async with serving(server, client_host):
            outcome.append(await puller._pull_from(server.peer_id, (1, 1)))

    _run(scenario)
    assert outcome == [None]
    assert view.plan is not None and view.plan.key == (1, 1)
    assert len(view.plan.data_addrs) == 901 and state.latest[(planner, "plan")] == plan
