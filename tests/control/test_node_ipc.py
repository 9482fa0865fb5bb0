"""A bootstrap and one member in one trio loop; a fake worker on the member's IPC socket gets a
plan that carries the data-plane addresses it announced."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.node import ControlNode, NodeConfig
from p2ptrain.control.status import swarm_status
from p2ptrain.records import (
    ComputeReport,
    Hello,
    PeerRecord,
    PlanMessage,
    RunMessage,
    RunSpec,
    SavedReport,
    SavedStage,
    StageCompute,
    issue_token,
)

DATA_ADDR = "/ip4/127.0.0.1/tcp/4242/p2p/12D3KooWdata"


# the one member's saved state of the whole model: nothing for the first plan to wait for
WHOLE_MODEL_SAVED = SavedStage(0, RunSpec().model.n_layer, 40, "root")


def test_worker_hello_reaches_the_plan_and_status(tmp_path):
    path = str(tmp_path / "control.sock")
    got: dict[str, Any] = {}

    organiser, member_seed = os.urandom(32), os.urandom(32)

    async def scenario() -> None:
        boot = ControlNode(
            NodeConfig(
                seed=organiser,
                role="bootstrap",
                run=RunSpec().replace(run_id="ipc-test", stages=2),
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
            hello = Hello(member.peer_id, (DATA_ADDR,), 4242)
            await worker.send_all((json.dumps(hello.to_dict()) + "\n").encode())
            buffer, timed = b"", False
            with trio.fail_after(30):
                while True:
                    buffer += await worker.receive_some(65536)
                    lines = [json.loads(x) for x in buffer.splitlines() if x.strip()]
                    runs = [m for m in lines if m["type"] == "run"]
                    if runs and not timed:  # the run spec comes ahead of any plan: time it
                        got["run"], timed = runs[0], True
                        saved = SavedReport("ipc-test", (WHOLE_MODEL_SAVED,))
                        compute = StageCompute(1e-3, 1e-4, 2e-4, 8, "cpu", "ipc-test")
                        for report in (saved, ComputeReport(compute)):  # as a worker sends them
                            line = json.dumps(report.to_dict()) + "\n"
                            await worker.send_all(line.encode())
                    plans = [m for m in lines if m["type"] == "plan"]
                    if plans and plans[-1]["plan"]["data_addrs"].get(member.peer_id):
                        got["plan"] = plans[-1]
                        break
            got["status"] = swarm_status(boot.view, time.monotonic()).to_dict()
            assert member.view.own_record is not None
            got["own_compute"] = member.view.own_record.stage_compute
            got["own_saved"] = member.view.own_record.saved
            # the member's signed record is in the DHT, and so is the bootstrap's run spec
            with trio.fail_after(10):
                got["dht_record"] = await member.dht.get_value(f"/p2ptrain/peer/{member.peer_id}")
                got["dht_run"] = await member.dht.get_value("/p2ptrain/run")
            got["member"] = member.peer_id
            await worker.aclose()
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert RunMessage.from_dict(got["run"]).run == RunSpec().replace(run_id="ipc-test", stages=2)
    message = PlanMessage.from_dict(got["plan"])
    assert message.run is not None and message.run.run_id == "ipc-test"
    plan = message.plan
    assert plan.pipelines == ((plan.planner,),)  # one member: one stage, itself
    assert plan.data_addrs[plan.planner] == (DATA_ADDR,)
    assert plan.network is None  # one peer: no links to scale the timeouts for
    status = got["status"]
    assert status["run"] == "ipc-test"
    [peer] = status["peers"]
    assert peer["role"] == "trainer" and peer["alive"]
    # the first plan waited for what the worker timed, which the member's record carries
    assert got["own_compute"] == StageCompute(1e-3, 1e-4, 2e-4, 8, "cpu", "ipc-test")
    assert got["own_saved"] == (WHOLE_MODEL_SAVED,)  # named in the member's record
    record = wire.decode(got["dht_record"], max_age_s=3600)
    assert record.kind == "peer" and record.author == got["member"]
    assert isinstance(record.body, PeerRecord) and record.body.data_addrs in ((), (DATA_ADDR,))
    assert wire.decode(got["dht_run"], max_age_s=3600).body == RunSpec().replace(
        run_id="ipc-test", stages=2
    )
