"""The worker outlives its control process: when the IPC socket closes (the supervisor restarts a
control process that died), the worker waits for the socket to come back, connects again and
repeats its hello (and its latest compute and copies reports), instead of stopping (issue 26: no per-connection failure ends a node)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from p2ptrain import identity
from p2ptrain.errors import UserError
from p2ptrain.ipc_lines import encode
from p2ptrain.records import CopyReport, Heartbeat, Hello, StageCopy, Stop
from p2ptrain.worker.ipc import IpcClient, PlanInbox


def listen_at(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(10)
    return server


def read_lines(conn: socket.socket, count: int) -> list[dict[str, object]]:
    conn.settimeout(10)
    data = b""
    while data.count(b"\n") < count:
        chunk = conn.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_worker_waits_for_a_restarted_control_and_says_hello_again(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    first = listen_at(path)
    inbox = PlanInbox()
    client = IpcClient(str(path), inbox, connect_timeout_s=5)
    conn, _ = first.accept()
    hello = Hello(identity.peer_id_of(os.urandom(32)), ("/ip4/127.0.0.1/tcp/1",), os.getpid())
    client.send(hello)
    client.send(Heartbeat("training", 7, 1, 1))
    copies = CopyReport((StageCopy(0, 2, hello.peer_id, None),), 1, 1)
    client.send(copies)  # a spare's duties: the next report may be a copy gap away
    assert [m["type"] for m in read_lines(conn, 3)] == ["hello", "heartbeat", "copies"]

    conn.close()  # the control process dies: its socket goes with it
    first.close()
    path.unlink()
    time.sleep(1.0)
    assert not inbox.stopped, "the worker stopped when its control process went away"
    client.send(Heartbeat("training", 8, 1, 1))  # dropped meanwhile, without an error

    second = listen_at(path)  # the restarted control process
    conn, _ = second.accept()
    # who it is and what it copies, not stale heartbeats
    assert read_lines(conn, 2) == [hello.to_dict(), copies.to_dict()]
    client.send(Heartbeat("training", 9, 1, 1))
    assert read_lines(conn, 1)[0]["step"] == 9
    conn.sendall(encode(Stop()))  # and the new control process's orders reach it
    deadline = time.monotonic() + 5
    while not inbox.stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    assert inbox.stopped
    conn.close()
    second.close()


def test_a_control_that_reads_nothing_does_not_hold_the_worker(
    tmp_path: Path, monkeypatch: object
) -> None:
    """A control process stalled (its stdout pipe full, its loop stopped) read nothing: the
    worker's blocking sends then held its trainer and heartbeat threads for good. A send now
    gives up after SEND_TIMEOUT_S and drops the connection, and the worker reconnects."""
    from p2ptrain.worker import ipc

    monkeypatch.setattr(ipc, "SEND_TIMEOUT_S", 0.5)  # type: ignore[attr-defined]
    path = tmp_path / "control.sock"
    server = listen_at(path)
    client = IpcClient(str(path), PlanInbox(), connect_timeout_s=5)
    stalled, _ = server.accept()  # accepts, never reads
    hello = Hello(identity.peer_id_of(os.urandom(32)), ("/ip4/127.0.0.1/tcp/1",), os.getpid())
    client.send(hello)
    big = Heartbeat("training" + " " * (1 << 20), 1, 1, 1)  # past the socket's buffers
    started = time.monotonic()
    for _ in range(4):
        client.send(big)
    assert time.monotonic() - started < 5.0  # each send gave up within its deadline
    again, _ = server.accept()  # the worker dropped the stalled connection and came back
    again.settimeout(10)
    first = b""
    while b"\n" not in first:
        first += again.recv(65536)
    assert json.loads(first.split(b"\n")[0])["type"] == "hello"
    stalled.close()


def test_a_worker_with_no_control_process_says_what_it_waits_for_then_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker started by hand on a socket nobody serves waited without a word, then ended
    in a ConnectionRefusedError traceback."""
    path = tmp_path / "nobody.sock"
    caplog.set_level("INFO", logger="p2ptrain.worker.ipc")
    with pytest.raises(UserError, match="no control process listened there in 1 s"):
        IpcClient(str(path), PlanInbox(), connect_timeout_s=1.0)
    assert f"waiting up to 1 s for the control process at {path}" in caplog.text
