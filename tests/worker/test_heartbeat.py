"""The worker's side of its health (issue 11, attack 7): heartbeats flow from its own thread
before any plan, the freeze fault stops its whole process group, and a worker whose hivemind DHT
process died stops (its p2pd would live on)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from p2ptrain.ipc_lines import LineBuffer, decode
from p2ptrain.records import Heartbeat
from p2ptrain.worker import pulse
from p2ptrain.worker.faults import FREEZE, Fault, Faults
from p2ptrain.worker.main import Worker
from p2ptrain.worker.pulse import HEARTBEAT_INTERVAL_S
from p2ptrain.worker.settings import WorkerSettings


def test_a_worker_heartbeats_from_its_own_thread_before_any_plan(tmp_path: Path) -> None:
    path = str(tmp_path / "control.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    worker = Worker(WorkerSettings(ipc=path))  # connects; run() (hivemind) is never called
    for sig, handler in handlers.items():  # the worker's are for its own process
        signal.signal(sig, handler)
    conn, _ = server.accept()
    conn.settimeout(3 * HEARTBEAT_INTERVAL_S)
    beats: list[Heartbeat] = []
    lines = LineBuffer()
    deadline = time.monotonic() + 3 * HEARTBEAT_INTERVAL_S
    while len(beats) < 2 and time.monotonic() < deadline:
        for line in lines.feed(conn.recv(65536)):
            message = decode(line)
            assert isinstance(message, Heartbeat)
            beats.append(message)
    worker.inbox.stop()
    conn.close()
    server.close()
    assert len(beats) >= 2
    assert beats[0] == Heartbeat("starting", 0, 0, 0)


class FakeDht:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None


def test_a_worker_whose_dht_process_died_stops_and_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pulse, "DHT_LOST_EXIT_S", 0.05)
    left: list[int] = []
    done = threading.Event()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    settings = WorkerSettings(plan=str(tmp_path / "plan.json"), name="w0")

    def leave(code: int) -> None:
        left.append(code)
        done.set()

    worker = Worker(settings, leave)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    worker.pulse.check_dht()  # no DHT yet, or shut down by run(): nothing to judge
    worker.pulse.dht = FakeDht(None)  # type: ignore[assignment]
    worker.pulse.check_dht()
    assert not worker.inbox.stopped and not worker.pulse.failure
    worker.pulse.dht = FakeDht(-9)  # type: ignore[assignment]
    worker.pulse.check_dht()
    assert worker.inbox.stopped and "exit code -9" in worker.pulse.failure
    assert worker.pulse.stop_code() == 1  # the node sees a failure, not a finished worker
    assert done.wait(5) and left == [1]  # the trainer did not return in time: it leaves


def test_the_freeze_fault_parses_and_stops_the_process_group() -> None:
    assert Fault.parse("freeze@8:1:1") == Fault(FREEZE, 8, 1, 1)
    code = (
        "from p2ptrain.worker.faults import Faults, Fault\n"
        "import sys\n"
        "faults = Faults((Fault.parse('freeze@3:1:0'),))\n"
        "faults.before_averaging(2, 1, 0)\n"  # another step: nothing happens
        "print('before', flush=True)\n"
        "faults.before_averaging(3, 1, 0)\n"
        "print('thawed', flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"before\n"
        deadline = time.monotonic() + 10
        while _state(proc.pid) != "T":
            assert time.monotonic() < deadline, "the group was not stopped"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGCONT)
        assert proc.stdout.readline() == b"thawed\n"
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert Faults((Fault(FREEZE, 3, 1, 0),)).to_argv() == ["--fault", "freeze@3:1:0"]


def _state(pid: int) -> str:
    # /proc/PID/stat: "pid (comm) STATE ..."
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
