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


def test_a_worker_that_reads_nothing_delays_nobody_and_is_dropped(tmp_path, monkeypatch):
    """`send` used to write to each worker in turn, without a deadline: one connected client
    that read nothing (a frozen worker, any local process of ours) blocked plan delivery for
    good. Each client has a writer of its own now, and one that reads nothing is dropped."""
    from p2ptrain.control import ipc

    monkeypatch.setattr(ipc, "SEND_TIMEOUT_S", 2.0)
    path = str(tmp_path / "control.sock")
    big = PlanMessage(Plan.from_dict(plan_dict()), RunSpec())
    monkeypatch.setattr(ipc, "encode", lambda message: b"x" * (4 << 20) + b"\n")  # past any buffer

    async def scenario() -> tuple[float, int, int, bytes]:
        server = IpcServer(path, lambda message: None)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            stuck = await trio.open_unix_socket(path)  # connects, never reads
            await trio.sleep(0.1)
            started = trio.current_time()
            await server.send(big)
            await server.send(big)
            returned_s = trio.current_time() - started
            before_drop = len(server._clients)  # send returned while the client was still held
            with trio.fail_after(10):
                while server._clients:  # noqa: ASYNC110 - no event to wait on
                    await trio.sleep(0.05)
            left = len(server._clients)
            got = await stuck.receive_some(1)  # its connection was closed: reads end
            with trio.fail_after(5):
                while got:
                    got = await stuck.receive_some(1 << 20)
            nursery.cancel_scope.cancel()
        return returned_s, before_drop, left, got

    returned_s, before_drop, left, got = trio.run(scenario)
    assert before_drop == 1 and returned_s < 1.0  # send never waited on it
    assert left == 0 and got == b""


def test_a_plan_sent_while_another_is_being_written_is_not_lost(tmp_path, monkeypatch):
    """A plan sent while a reconnecting worker was still being replayed the last one was
    dropped (BusyResourceError, suppressed) and the worker trained under the old plan; now the
    newest plan always arrives, after the older ones."""
    from p2ptrain.control import ipc

    padded = ipc.encode
    # 1 MiB of JSON whitespace a line: the replay outlasts the next send
    monkeypatch.setattr(ipc, "encode", lambda m: padded(m)[:-1] + b" " * (1 << 20) + b"\n")
    path = str(tmp_path / "control.sock")
    base = Plan.from_dict(plan_dict())
    plans = [
        PlanMessage(base.replace(epoch=e, lineage=((base.lineage[0][0], e),)), RunSpec())
        for e in (1, 2)
    ]

    async def scenario() -> list[int]:
        server = IpcServer(path, lambda message: None)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            await server.send(plans[0])  # replayed to the worker that connects next
            client = await trio.open_unix_socket(path)
            with trio.fail_after(5):
                while not server._clients:  # noqa: ASYNC110 - no event to wait on
                    await trio.sleep(0.01)
            await trio.sleep(0.1)  # the replay is being written: the socket's buffer is full
            await server.send(plans[1])
            buffer = b""
            with trio.move_on_after(3):
                while buffer.count(b"\n") < 2:
                    buffer += await client.receive_some(1 << 20)
            await client.aclose()
            nursery.cancel_scope.cancel()
        return [PlanMessage.from_dict(json.loads(line)).plan.epoch for line in buffer.splitlines()]

    assert trio.run(scenario) == [1, 2]


def test_a_worker_that_resets_mid_write_ends_only_its_connection(tmp_path, monkeypatch):
    """A worker gone in the middle of a write (a reset): its writer's failure ends its own
    connection, never the IPC server, and the next worker still gets the plan replayed."""
    import socket
    import struct

    from p2ptrain.control import ipc

    padded = ipc.encode
    monkeypatch.setattr(ipc, "encode", lambda m: padded(m)[:-1] + b" " * (4 << 20) + b"\\n")
    path = str(tmp_path / "control.sock")
    plan = PlanMessage(Plan.from_dict(plan_dict()), RunSpec())

    async def scenario() -> int:
        server = IpcServer(path, lambda message: None)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            await server.send(plan)
            gone = await trio.open_unix_socket(path)
            with trio.fail_after(5):
                while not server._clients:  # noqa: ASYNC110 - no event to wait on
                    await trio.sleep(0.01)
            await trio.sleep(0.1)  # the replay is being written
            gone.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            gone.socket.close()  # a reset, mid-write
            await trio.sleep(0.3)
            late = await trio.open_unix_socket(path)  # the server still serves
            got = 0
            with trio.fail_after(10):
                while got < (4 << 20):
                    got += len(await late.receive_some(1 << 20))
            await late.aclose()
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(scenario) >= 4 << 20
