"""`p2ptrain status` says where each peer's session started (issue 30): the worker's metrics
report reaches the gossiped metrics, the status document (--json) and the table."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio

from p2ptrain import identity
from p2ptrain.cli.status_cmd import format_status
from p2ptrain.control.node import ControlNode, NodeConfig
from p2ptrain.control.status import swarm_status
from p2ptrain.records import Hello, MetricsReport, RunSpec, SwarmStatus, issue_token
from tests.control.test_view import A, B, make_view
from tests.records.samples import metrics_dict

LINEAGE = "0123456789abcdef"
RESUMED = f"resumed from step 10 (lineage {LINEAGE})"


def test_status_shows_the_step_and_lineage_a_peer_resumed_from() -> None:
    v, feed = make_view()
    started = {"step": 12, "start_step": 10, "start_lineage": LINEAGE}
    fresh = {"step": 3, "start_step": 0, "resume_never": True}
    v.accept(feed("telemetry", A, {"links": {}, "metrics": started}), 0.1)
    v.accept(feed("telemetry", B, {"links": {}, "metrics": fresh}), 0.1)
    document = swarm_status(v, 0.2).to_dict()
    assert SwarmStatus.from_dict(document).to_dict() == document  # what --json prints
    peers = {p["id"]: p for p in document["peers"]}
    assert peers[A]["metrics"]["start_step"] == 10
    assert peers[A]["metrics"]["start_lineage"] == LINEAGE
    assert peers[A]["started"] == RESUMED
    assert peers[B]["started"] == 'started from initial weights (resume = "never")'
    assert peers[B]["metrics"]["start_step"] == 0 and peers[B]["metrics"]["resume_never"]
    table = format_status(SwarmStatus.from_dict(document))
    assert f"…{A[-8:]}" in table and RESUMED in table
    # a peer of before issue 30 says nothing: no field is missing, the text is empty
    v.accept(feed("telemetry", A, {"links": {}, "metrics": {"step": 13}}), 0.3)
    older = swarm_status(v, 0.4).to_dict()
    peer = next(p for p in older["peers"] if p["id"] == A)
    assert peer["started"] == "" and peer["metrics"]["start_step"] is None
    assert RESUMED not in format_status(SwarmStatus.from_dict(older))


def test_a_workers_resumed_step_reaches_the_organisers_status(tmp_path: Any) -> None:
    """Real nodes: the member's worker reports a resumed session over its IPC socket; the
    bootstrap's status document (from gossiped telemetry) says so."""
    path = str(tmp_path / "control.sock")
    organiser, member_seed = os.urandom(32), os.urandom(32)
    got: dict[str, Any] = {}

    async def scenario() -> None:
        boot = ControlNode(
            NodeConfig(
                seed=organiser,
                role="bootstrap",
                run=RunSpec().replace(run_id="resume-test"),
                print_addr=False,
            )
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(boot.run)
            member = ControlNode(
                NodeConfig(
                    seed=member_seed,
                    role="trainer",
                    bootstrap_addr=boot.addrs[0],
                    ipc_path=path,
                    print_addr=False,
                    token=issue_token(organiser, identity.peer_id_of(member_seed), True, 2e9),
                )
            )
            await nursery.start(member.run)
            worker = await trio.open_unix_socket(path)
            report = MetricsReport.from_dict(
                {**metrics_dict(), "step": 10, "start_step": 10, "start_lineage": LINEAGE}
            )
            for message in (Hello(member.peer_id, (), 4242), report):
                await worker.send_all((json.dumps(message.to_dict()) + "\n").encode())
            with trio.fail_after(30):
                while True:
                    document = swarm_status(boot.view, time.monotonic()).to_dict()
                    peers = [p for p in document["peers"] if p["id"] == member.peer_id]
                    if peers and peers[0]["started"]:
                        got["peer"] = peers[0]
                        break
                    await trio.sleep(0.2)
            await worker.aclose()
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert got["peer"]["started"] == RESUMED
    assert got["peer"]["metrics"]["start_step"] == 10
