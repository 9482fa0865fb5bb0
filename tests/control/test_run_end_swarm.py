"""A finished run on loopback, in one trio loop: a member's fake worker reports the run's last
step; the bootstrap's status says finished; a late joiner learns it, stops its worker and
leaves on its own; nobody plans the finished run again."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio

from p2ptrain import identity
from p2ptrain.control.node import ControlNode, NodeConfig, run_until_signalled
from p2ptrain.control.status import swarm_status
from p2ptrain.records import Hello, MetricsReport, RunSpec, SavedReport, issue_token

RUN = RunSpec().replace(run_id="end-swarm", stages=1, n_layer=2, steps=3, compute_aware=False)


class FakeWorker:
    """The worker side of a member's IPC socket: says hello, reads what the control sends."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    @classmethod
    async def connect(cls, path: str, peer: str, port: int) -> FakeWorker:
        worker = cls(await trio.open_unix_socket(path))
        await worker.send(Hello(peer, (f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}",), port).to_dict())
        return worker

    async def say_saved(self) -> None:
        """Once the run spec came, say we hold no state of it (the first plan waits for it)."""
        run = (await self.wait_for("run"))["run"]
        await self.send(SavedReport(run["run_id"], ()).to_dict())

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all((json.dumps(message) + "\n").encode())

    async def wait_for(self, kind: str) -> dict[str, Any]:
        while True:
            for line in self.buffer.splitlines():
                if line.strip() and (message := json.loads(line))["type"] == kind:
                    return message
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError(f"the control process closed the socket before a {kind!r}")
            self.buffer += data


def test_a_late_joiner_of_a_finished_run_leaves_and_nobody_plans_it_again(tmp_path) -> None:
    organiser = os.urandom(32)
    got: dict[str, Any] = {}

    def member(name: str) -> ControlNode:
        seed = os.urandom(32)
        return ControlNode(
            NodeConfig(
                seed=seed,
                role="trainer",
                bootstrap_addr=boot.addrs[0],
                ipc_path=str(tmp_path / f"{name}.sock"),
                print_addr=False,
                token=issue_token(organiser, identity.peer_id_of(seed), True, 2e9),
            )
        )

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(boot.run)
            first = member("first")
            await nursery.start(first.run)
            worker = await FakeWorker.connect(str(tmp_path / "first.sock"), first.peer_id, 4001)
            await worker.say_saved()
            with trio.fail_after(40):
                plan = (await worker.wait_for("plan"))["plan"]
            # the plan places our one member: it trains the three steps, the last one reported
            for n in range(RUN.optim.steps):
                report = MetricsReport(n, 3.0, 100.0, 0, 0, 8, "solo", 0.1, 1, plan["term"], 1)
                await worker.send(report.to_dict())
            with trio.fail_after(20):
                while not boot.view.finished:  # noqa: ASYNC110 (the view has no event to wait on)
                    await trio.sleep(0.1)
            # a late joiner learns the run is finished, stops its worker and leaves by itself
            late = member("late")
            joined_at = time.monotonic()
            with trio.fail_after(30):
                async with trio.open_nursery() as inner:
                    inner.start_soon(run_until_signalled, late, late.stop_worker)
                    socket = trio.Path(tmp_path / "late.sock")
                    while not await socket.exists():  # noqa: ASYNC110 (a file, no event)
                        await trio.sleep(0.05)
                    late_worker = await FakeWorker.connect(
                        str(tmp_path / "late.sock"), late.peer_id, 4002
                    )
                    got["late_stop"] = await late_worker.wait_for("stop")
            got["late_left_s"] = time.monotonic() - joined_at
            got["late_plans"] = late_worker.buffer.count(b'"type": "plan"')
            got["status"] = swarm_status(boot.view, time.monotonic()).to_dict()
            got["plan_version"] = boot.view.plan_version
            nursery.cancel_scope.cancel()

    boot = ControlNode(NodeConfig(seed=organiser, role="bootstrap", run=RUN, print_addr=False))
    trio.run(scenario)
    assert got["late_stop"] == {"type": "stop"}
    assert got["late_left_s"] < 30
    assert got["late_plans"] == 0  # the late joiner was never planned for the finished run
    status = got["status"]
    assert status["finished"] and status["waiting"] == "finished"
    assert "run end-swarm is finished" in status["waiting_for"]
    assert (status["plan"]["term"], status["plan"]["epoch"]) == (1, 1)
