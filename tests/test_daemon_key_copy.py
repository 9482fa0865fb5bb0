"""Issue 26, finding 14: every worker start left a copy of the node's private key in the system
temp directory. The copy p2pd reads lives in a 0700 directory beside the identity file and is
removed once p2pd has it, at exit, and (after a SIGKILL) by the next start."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from p2ptrain import identity
from tests.conftest import REPO_ROOT
from tests.key_copies import copies_beside, key_copies_outside


def test_the_copy_lies_beside_the_identity_private_and_goes_away(tmp_path: Path) -> None:
    key = tmp_path / "ids" / "node.key"
    seed = identity.load_or_create_identity(key)
    copy = identity.DaemonKeyCopy(seed, key)
    assert copy.path.parent.parent == key.parent  # beside it, not in the temp directory
    assert stat.S_IMODE(copy.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(copy.path.stat().st_mode) == 0o600
    assert copy.path.read_bytes() == identity.hivemind_key_bytes(seed)
    assert identity.load_identity(copy.path) == seed  # the same peer id for p2pd
    assert key_copies_outside(key.parent, [key]) == []
    copy.remove()
    copy.remove()  # twice is fine (finally and atexit)
    assert not copy.directory.exists() and copies_beside(key) == []
    assert sorted(p.name for p in key.parent.iterdir()) == ["node.key"]


def test_a_throwaway_key_goes_away_too() -> None:
    copy = identity.DaemonKeyCopy(os.urandom(32), None)
    assert stat.S_IMODE(copy.directory.stat().st_mode) == 0o700
    copy.remove()
    assert not copy.directory.exists()


def test_a_copy_is_removed_at_exit(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    identity.load_or_create_identity(key)
    script = (
        "import sys; from p2ptrain import identity; "
        f"c = identity.DaemonKeyCopy(identity.load_identity({str(key)!r}), {str(key)!r}); "
        "print(c.path, flush=True); sys.exit(3)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, cwd=REPO_ROOT, timeout=60, check=False
    )
    assert out.returncode == 3, out.stderr.decode()
    assert str(key.parent) in out.stdout.decode()
    assert copies_beside(key) == []


def test_what_a_killed_worker_left_is_swept_by_the_next_start(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    seed = identity.load_or_create_identity(key)
    stale = tmp_path / f".node.key.p2pd-{_a_dead_pid()}"  # a SIGKILL before p2pd had started
    stale.mkdir(mode=0o700)
    (stale / "p2pd.key").write_bytes(identity.hivemind_key_bytes(seed))
    running = tmp_path / ".node.key.p2pd-1"  # a live process's (pid 1): maybe a worker's
    running.mkdir()
    other = tmp_path / ".other.key.p2pd-999999999"  # another identity's: not this one's
    other.mkdir()
    copy = identity.DaemonKeyCopy(seed, key)
    assert not stale.exists() and running.exists() and other.exists()
    assert copies_beside(key) == sorted([copy.directory, running])
    copy.remove()


def _a_dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
