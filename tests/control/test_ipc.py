"""The control side of the worker IPC over a real Unix socket."""

from __future__ import annotations

import json
from typing import Any

import trio

from p2ptrain.control.ipc import IpcServer


def test_messages_flow_both_ways_and_bad_lines_are_skipped(tmp_path, caplog):
    path = str(tmp_path / "control.sock")
    received: list[dict[str, Any]] = []
    replies: list[dict[str, Any]] = []

    def on_message(message: dict[str, Any]) -> None:
        if message["type"] == "explode":
            raise ValueError("handler refused it")
        received.append(message)
        if len(received) == 2:
            both_received.set()

    both_received = trio.Event()

    async def scenario() -> None:
        server = IpcServer(path, on_message)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            await server.send({"type": "plan", "plan": {"epoch": 1}, "run": {}})  # before connect
            client = await trio.open_unix_socket(path)
            hello = {
                "type": "hello",
                "peer_id": "12D3KooWx",
                "data_addrs": ["/ip4/127.0.0.1/tcp/1"],
            }
            lines = [
                json.dumps(hello),
                "this is not json",
                json.dumps({"no": "type"}),
                json.dumps({"type": "explode"}),
                json.dumps({"type": "metrics", "step": 3, "loss": 2.5}),
            ]
            await client.send_all(("\n".join(lines) + "\n").encode())
            buffer = b""
            with trio.fail_after(5):
                while buffer.count(b"\n") < 1:
                    buffer += await client.receive_some(65536)
                await both_received.wait()
                await server.send({"type": "stop"})
                while buffer.count(b"\n") < 2:
                    buffer += await client.receive_some(65536)
            replies.extend(json.loads(line) for line in buffer.splitlines())
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert [m["type"] for m in received] == ["hello", "metrics"]
    assert [r["type"] for r in replies] == ["plan", "stop"]  # a late worker still gets the plan
    assert replies[0]["plan"] == {"epoch": 1}
    assert caplog.text.count("ipc: dropping") == 3
