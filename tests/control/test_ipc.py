"""The control side of the worker IPC over a real Unix socket."""

from __future__ import annotations

import json

import trio

from p2ptrain.control.ipc import IpcServer
from p2ptrain.records import Hello, Message, MetricsReport, Plan, PlanMessage, RunSpec, Stop
from tests.records.samples import metrics_dict, plan_dict


def test_messages_flow_both_ways_and_bad_lines_are_skipped(tmp_path, caplog):
    path = str(tmp_path / "control.sock")
    received: list[Message] = []
    replies: list[dict] = []

    def on_message(message: Message) -> None:
        received.append(message)
        if len(received) == 2:
            both_received.set()

    both_received = trio.Event()
    plan = PlanMessage(Plan.from_dict(plan_dict()), RunSpec())
    hello = Hello("12D3KooWx", ("/ip4/127.0.0.1/tcp/1",), 4242)

    async def scenario() -> None:
        server = IpcServer(path, on_message)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            await server.send(plan)  # before the worker connects
            client = await trio.open_unix_socket(path)
            lines = [
                json.dumps(hello.to_dict()),
                "this is not json",
                json.dumps({"no": "type"}),
                json.dumps({"type": "metrics", "step": 3, "loss": 2.5}),  # fields missing
                json.dumps(metrics_dict()),
            ]
            await client.send_all(("\n".join(lines) + "\n").encode())
            buffer = b""
            with trio.fail_after(5):
                while buffer.count(b"\n") < 1:
                    buffer += await client.receive_some(65536)
                await both_received.wait()
                await server.send(Stop())
                while buffer.count(b"\n") < 2:
                    buffer += await client.receive_some(65536)
            replies.extend(json.loads(line) for line in buffer.splitlines())
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert received == [hello, MetricsReport.from_dict(metrics_dict())]
    assert [r["type"] for r in replies] == ["plan", "stop"]  # a late worker still gets the plan
    assert PlanMessage.from_dict(replies[0]) == plan
    assert caplog.text.count("ipc: dropping") == 3
