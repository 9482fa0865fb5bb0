"""`p2ptrain doctor` leaves no daemon behind: when its network checks raise (Ctrl-C), the daemon
check's whole process group (its p2pd too) is killed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from p2ptrain import procs
from p2ptrain.control.doctor import NetworkReport
from p2ptrain.node import doctor
from p2ptrain.node.doctor import DoctorSettings, diagnose
from tests.records.samples import A

# a daemon check that never answers, with a child of its own in its group (as p2pd is)
CHECK = (
    "import subprocess, time; subprocess.Popen(['sleep', '60']); print('started', flush=True); "
    "time.sleep(60)"
)


def group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True).returncode != 0:
            return True
        time.sleep(0.05)
    return False


def test_an_interrupted_doctor_kills_the_daemon_check(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []

    def start(data_listen: str, device: str) -> subprocess.Popen[bytes]:
        started.append(procs.spawn([sys.executable, "-c", CHECK], stdout=subprocess.PIPE))
        return started[-1]

    def interrupted(*args: object) -> NetworkReport:
        check_stdout = started[-1].stdout
        assert check_stdout is not None
        assert check_stdout.readline() == b"started\n"  # the check has started its child
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "worker_available", lambda: True)
    monkeypatch.setattr(doctor, "start_daemon_check", start)
    monkeypatch.setattr(doctor, "run_network_checks", interrupted)
    settings = DoctorSettings(
        f"/ip4/127.0.0.1/tcp/1/p2p/{A}", "/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/0"
    )
    try:
        with pytest.raises(KeyboardInterrupt):
            diagnose(settings)
        (check,) = started
        assert check.returncode is not None  # killed and reaped
        assert group_gone(check.pid, 5), "the daemon check's child outlived the doctor"
    finally:
        procs.kill_groups(started)
