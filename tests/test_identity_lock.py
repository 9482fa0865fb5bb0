"""One node per identity (node/identity_lock.py): a second node with a live node's identity is
refused at its start (both used to run fully, announcing one peer id and writing one
checkpoint directory); the lock goes with its process, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2ptrain import procs
from p2ptrain.errors import UserError
from p2ptrain.node.identity_lock import IdentityLock

HOLD = """
import sys, time
from p2ptrain.node.identity_lock import IdentityLock
IdentityLock(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_node_with_one_identity_is_refused_until_the_first_releases(
    tmp_path: Path,
) -> None:
    key = tmp_path / "node.key"
    first = IdentityLock(key)
    with pytest.raises(UserError, match=f"process {os.getpid()}"):
        IdentityLock(key)
    IdentityLock(tmp_path / "other.key").release()  # another identity: no conflict
    first.release()
    IdentityLock(key).release()


def test_a_killed_nodes_lock_goes_with_it(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(key)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"process {holder.pid}"):
            IdentityLock(key)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        _wait_acquired(key, 5)  # the dead node's lock goes with it
    finally:
        holder.kill()
        holder.wait()


def _wait_acquired(key: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            IdentityLock(key).release()
            return
        except UserError:
            assert time.monotonic() < deadline, "the lock stayed"
            time.sleep(0.05)


def test_a_child_given_the_lock_holds_it_after_its_parent_is_gone(tmp_path: Path) -> None:
    """A supervisor SIGKILLed leaves its worker saving its stage for a while: the lock, passed
    to the worker (procs.spawn pass_fds), refuses a restarted node until the worker is gone."""
    key = tmp_path / "node.key"
    lock = IdentityLock(key)
    child = procs.spawn(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        pass_fds=(lock.fd,),
        die_with_parent=None,
    )
    try:
        lock.release()  # the supervisor's end
        with pytest.raises(UserError, match="or its worker, still stopping"):
            IdentityLock(key)
        child.kill()
        child.wait(timeout=10)
        _wait_acquired(key, 5)
    finally:
        child.kill()


def test_a_symlink_planted_as_the_lock_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    """A symlink under the lock's name had its target truncated to our PID."""
    victim = tmp_path / "victim.txt"
    victim.write_text("private\n")
    (tmp_path / ".node.key.lock").symlink_to(victim)
    with pytest.raises(UserError, match=r"identity lock .*: a symbolic link"):
        IdentityLock(tmp_path / "node.key")
    assert victim.read_text() == "private\n"


def test_a_fifo_as_the_lock_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / ".node.key.lock")
    code = (
        "import sys\nfrom p2ptrain.errors import UserError\n"
        "from p2ptrain.node.identity_lock import IdentityLock\n"
        "try:\n    IdentityLock(sys.argv[1])\nexcept UserError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "node.key")],
        capture_output=True,
        text=True,
        timeout=120,  # a hang's bound only
    )
    assert "not a regular file" in done.stdout, done.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="makes a file of another user")
def test_another_users_lock_file_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / ".node.key.lock"
    lock.write_text("123")
    os.chown(lock, 65534, 65534)
    with pytest.raises(UserError, match="another user's file"):
        IdentityLock(tmp_path / "node.key")
    assert lock.read_text() == "123"
