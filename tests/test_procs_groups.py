"""A child's process group is signalled by its id, the child's PID: once the child is reaped that
number may be another's, so a group is signalled after its leader's reaping only while members of
it live; stop_groups waits for its children without reaping them until the final SIGKILL. As PID
1, the supervisor reaps the orphans handed to it, never its own children (their Popen reads
their exit status)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from p2ptrain import procs
from tests.conftest import live_group_members

# a leader that leaves a member behind in its group, ignoring SIGTERM, and exits on SIGTERM
LEAVES_A_MEMBER = (
    "import os, signal, subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def _start_leaving_a_member() -> subprocess.Popen[bytes]:
    proc = procs.spawn([sys.executable, "-c", LEAVES_A_MEMBER], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_a_reaped_leader_s_empty_group_is_not_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = procs.spawn(["true"])
    proc.wait()
    sent: list[int] = []
    monkeypatch.setattr(procs.os, "killpg", lambda pgid, signum: sent.append(pgid))
    procs.kill_group(proc)
    procs.kill_groups([proc])
    assert sent == []  # its number may name someone else's group by now


def test_a_reaped_leader_s_group_with_members_is_still_killed() -> None:
    proc = _start_leaving_a_member()
    try:
        proc.kill()
        proc.wait()  # reaped: its member lives on in the group
        assert live_group_members(proc.pid)
        procs.kill_group(proc)
        assert _wait(lambda: not live_group_members(proc.pid))
    finally:
        if live_group_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_stop_groups_kills_what_a_stopped_leader_left_in_its_group() -> None:
    proc = _start_leaving_a_member()
    procs.stop_groups([proc], grace_s=5.0)
    assert proc.returncode == -signal.SIGTERM  # the leader stopped on SIGTERM, then was reaped
    assert _wait(lambda: not live_group_members(proc.pid))  # its member ignored SIGTERM: SIGKILLed


def test_reap_orphans_leaves_the_kept_children_s_exit_status() -> None:
    kept = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    orphan = os.posix_spawn("/bin/true", ["true"], os.environ)  # no Popen: nobody reaps it
    reaped: list[int] = []
    try:
        assert _wait(lambda: bool(reaped.extend(procs.reap_orphans([kept.pid])) or reaped))
        assert reaped == [orphan]
        with pytest.raises(ChildProcessError):
            os.waitpid(orphan, os.WNOHANG)  # already reaped
        assert kept.wait(timeout=60) == 3  # its status was left to its Popen
    finally:
        kept.kill()
        kept.wait()


def _wait(condition: object) -> bool:
    """Until condition() holds (True); hang guard 60 s."""
    assert callable(condition)
    pause = threading.Event()
    for _ in range(600):
        if condition():
            return True
        pause.wait(0.1)
    return False
