"""Child process trees: start one in its own process group, stop many. Stdlib only.

Every child leads a new session, so that signalling its process group reaches whatever it started
(a worker's hivemind children and p2pd stay in its group). Optionally the kernel signals the child
when its parent dies (PR_SET_PDEATHSIG), so that no tree outlives whoever started it, even a
SIGKILLed one. The node supervisor, the harnesses and the tests all start and stop children here;
the processes of a node raise their open-file limit here.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# loaded here, once: between fork and exec the child should only call into it
_LIBC = ctypes.CDLL(None, use_errno=True)


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux only).

    The parent is the thread that forked this process: its exit fires the signal."""
    if _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path | str | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    env: Mapping[str, str] | None = None,
    die_with_parent: int | None = signal.SIGKILL,
    cwd: Path | str | None = None,
    stdin: int | None = None,
    new_session: bool = True,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start argv as the leader of a new session (and process group), unless `new_session` is
    False (then it stays in ours); stdin is /dev/null unless given (e.g. subprocess.PIPE).

    log_path: stderr goes to this file (truncated), and stdout too unless `stdout` is given
    (e.g. subprocess.PIPE); without either, the child writes where this process does. `stderr`
    (e.g. subprocess.PIPE, for a relay that never lets a stalled reader block the child) wins
    over log_path for stderr.
    env: variables on top of this process's environment (PYTHONUNBUFFERED is set, so that logs
    arrive as they are written). die_with_parent: the signal the kernel sends the child when the
    calling thread exits (None: none), so spawn from a thread that lives as long as the child.
    pass_fds: descriptors the child keeps open (a lock it must hold as long as it lives)."""
    preexec = None if die_with_parent is None else parent_death(die_with_parent)
    log_file = open(log_path, "wb") if log_path is not None else None  # noqa: SIM115
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=stdout if stdout is not None else log_file,
            stderr=stderr if stderr is not None else log_file,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=cwd,
            start_new_session=new_session,
            preexec_fn=preexec,
            pass_fds=tuple(pass_fds),
        )
    finally:
        if log_file is not None:
            log_file.close()  # the child has its own copy


def parent_death(sig: int) -> Callable[[], None]:
    """A Popen `preexec_fn`: the child gets `sig` when the thread that forks it exits (so fork
    from one that lives as long as the child: the main thread, not a pool's worker), or at once
    if this process died before the child could ask the kernel."""
    return partial(_die_with_parent, sig, os.getpid())


def _die_with_parent(sig: int, parent_pid: int) -> None:
    # in the child, between fork and exec
    set_parent_death_signal(sig)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def kill_group(proc: subprocess.Popen[bytes], signum: int = signal.SIGKILL) -> None:
    """Send signum to the child's whole process group (if anything of it is left). Once the
    child was reaped, its PID (the group's id) may be another's: the group is signalled only
    while members of it live (`_group_outlived_leader`)."""
    if proc.returncode is not None and not _group_outlived_leader(proc.pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def _group_outlived_leader(pgid: int) -> bool:
    """Does process group `pgid`, whose leader was reaped, still have members? While one lives,
    the kernel keeps the number from reuse (it names a group); a process whose own PID is the
    number is a newcomer that got it once the group was empty."""
    found = False
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # no /proc to judge by: signal it, as before
        return True
    for entry in entries:
        if not (entry.name.isascii() and entry.name.isdigit()):
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # after the command's last ")": state, ppid, pgrp
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                if int(entry.name) == pgid:
                    return False
                found = True
    return found


def kill_groups(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every child's process group, then reap the children: signalled before they are
    reaped, their groups' ids are still theirs."""
    for proc in procs:
        kill_group(proc)
    for proc in procs:
        proc.wait()


def stop_groups(
    procs: Sequence[subprocess.Popen[bytes]],
    grace_s: float,
    leaders_only: Sequence[subprocess.Popen[bytes]] = (),
) -> None:
    """SIGTERM every child's process group (in the order given), wait up to grace_s for the
    children to exit, then SIGKILL the groups (what ignored SIGTERM, and whatever a child left
    behind in its group) and reap the children. A child in `leaders_only` is sent SIGTERM
    itself, not its group: it stops its own children in order (a worker's averager serves its
    groupmates' round until the worker closes it)."""
    for proc in procs:
        if proc in leaders_only:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        else:
            kill_group(proc, signal.SIGTERM)
        kill_group(proc, signal.SIGCONT)  # a stopped (frozen) group acts on SIGTERM only then
    deadline = time.monotonic() + grace_s
    for proc in procs:
        if not _exited(proc, max(0.0, deadline - time.monotonic())):
            log.warning(
                "process %d did not stop in %.0f s after SIGTERM: killing its group",
                proc.pid,
                grace_s,
            )
    kill_groups(procs)


def _exited(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait up to timeout_s for the child to exit, leaving it unreaped: its zombie keeps its
    PID, the group's id, from reuse until kill_groups has signalled the group (reaped at once,
    the id could be another's by the SIGKILL, up to grace_s later)."""
    deadline = time.monotonic() + timeout_s
    pause_s = 0.001
    while proc.returncode is None:
        if not _running(proc.pid):  # exited, or reaped elsewhere (Popen.poll sets returncode)
            return True
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return False
        time.sleep(min(pause_s, left_s))
        pause_s = min(pause_s * 2, 0.05)
    return True


def reap_orphans(keep: Iterable[int]) -> list[int]:
    """Reap this process's exited children but those in `keep` (whose exit status their Popen
    reads): what PID 1 must do for the orphans the kernel hands it (a container without
    --init). Only zombies, each by its PID: never a child still running, never one of keep's."""
    kept, reaped = set(keep), []
    for pid, (state, _) in children().items():
        if state == "Z" and pid not in kept:
            with contextlib.suppress(OSError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    reaped.append(pid)
    return reaped


def adopt_orphans() -> bool:
    """Become the subreaper of our descendants: one whose parent dies (a SIGKILLed node's
    worker, which then saves on its own) is handed to us, not to PID 1, for `stop_orphans` to
    stop. False where the system refuses (not Linux)."""
    return bool(_LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def stop_orphans(
    keep: Iterable[int], grace_s: float, on_found: Callable[[list[int]], None] | None = None
) -> list[int]:
    """Stop every live child but keep's (keep: what we started, which its owners stop and
    reap; the rest were handed to us, `adopt_orphans`) as `stop_groups` stops a leader: SIGTERM
    it, wait up to grace_s for it, then SIGKILL its group and reap it; then reap the zombies
    handed to us meanwhile. Their PIDs, which `on_found` hears first (to say what we wait
    for)."""
    kept = set(keep)
    own_group = os.getpgid(0)
    orphans = {
        pid: pgid
        for pid, (state, pgid) in children().items()
        if pid not in kept and state != "Z" and pgid != own_group
    }
    if orphans and on_found is not None:
        on_found(sorted(orphans))
    for pid, pgid in orphans.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)  # itself: a worker closes its own children in order
            os.killpg(pgid, signal.SIGCONT)  # a stopped (frozen) group acts on SIGTERM only then
    deadline = time.monotonic() + grace_s
    for pid in orphans:
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    for pgid in set(orphans.values()):  # the unreaped leaders keep the groups' ids theirs
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in orphans:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    reap_orphans(kept)
    return sorted(orphans)


def children() -> dict[int, tuple[str, int]]:
    """pid -> (state letter, process group) of each of this process's children (its own and
    those handed to it)."""
    ours, found = os.getpid(), {}
    for entry in Path("/proc").iterdir():
        if not (entry.name.isascii() and entry.name.isdigit()):
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            state, ppid, pgid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if int(ppid) == ours:
                found[int(entry.name)] = (state, int(pgid))
    return found


def _running(pid: int) -> bool:
    """Is our child `pid` still running (not yet a zombie)? Leaves it unreaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def count_matching(text: str) -> int:
    """Processes (other than ours) whose command line contains `text`: what a run left behind."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not (entry.name.isascii() and entry.name.isdigit()) or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if text.encode() in (entry / "cmdline").read_bytes():
                count += 1
    return count


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force.

    A service's usual soft limit is 1,024 while the hard one is far higher, and every connection
    and stream costs a node a descriptor: with the soft limit, a thousand idle connections ran
    a node out of them (issue 26, finding 2). Unchanged where the system refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft  # an unlimited hard limit is no value to set the soft one to
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard


def pid_alive(pid: int) -> bool:
    """Is process `pid` running (ours or someone else's)? A zombie, which its parent has not
    reaped yet, is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def make_pid_dir(parent: Path, prefix: str) -> Path:
    """Create the 0700 folder `prefix` + our PID under `parent`, for `sweep_pid_dirs` to remove
    once we are gone; a dead namesake's (PIDs are reused) is removed first."""
    directory = parent / f"{prefix}{os.getpid()}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700)
    directory.chmod(0o700)  # whatever the umask
    return directory


def sweep_pid_dirs(parent: Path, prefix: str) -> list[Path]:
    """Remove the folders under `parent` named `prefix` + PID whose process is gone (what a
    SIGKILLed process left: a key copy, a socket folder); those removed."""
    removed = []
    for directory in parent.glob(f"{prefix}*"):
        pid_text = directory.name.removeprefix(prefix)
        # ASCII digits: str.isdigit() takes "²", which int() refuses
        if pid_text.isascii() and pid_text.isdigit() and not pid_alive(int(pid_text)):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed
