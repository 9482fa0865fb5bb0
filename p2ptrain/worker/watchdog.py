"""No orphans: hivemind's children and p2pd must never outlive the worker.

hivemind forks a DHT process and an averager process, and the DHT process starts `p2pd`; all stay
in the worker's process group, and all survive a SIGKILL of the worker (measured with hivemind 1.1.12).
So the worker (1) leads its own process group, (2) asks the kernel to signal it when its parent
dies (PR_SET_PDEATHSIG), and (3) forks a tiny watchdog child, before any thread exists, whose only
job is to SIGKILL the whole group the moment the worker dies, however it dies.

The parent's death is a SIGTERM, a graceful stop: the worker saves its stage first. Its
supervisor bounds such a stop with a SIGKILL after its grace; when the supervisor is the one that
died (a SIGKILL, the OOM killer), nobody would, so an orphaned worker bounds its own stop
(`stop_handler`). The bound is armed by the SIGTERM handler, and by a thread that watches for
the parent's death itself: a main thread stuck in a C call never runs a Python signal handler.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from p2ptrain.procs import set_parent_death_signal

# the watchdog's parent-death signal: not SIGTERM, which a supervisor may send the whole group
# for a graceful stop (the worker must be free to checkpoint first)
WATCHDOG_SIGNAL = signal.SIGUSR2
# an orphaned worker's stop, at most: the supervisor's own grace (node/supervisor.py STOP_GRACE_S)
ORPHAN_STOP_S = 30.0
_parent = [0]  # the process that started this one (install), to tell when it is gone
PARENT_POLL_S = 1.0  # how often the bound's thread looks for the parent


def install(parent_death_signal: int = signal.SIGTERM) -> int:
    """Lead a process group, die with the parent, start the group-killing watchdog; its pid."""
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    parent = _parent[0] = os.getppid()
    set_parent_death_signal(parent_death_signal)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), parent_death_signal)
    worker_pid = os.getpid()
    watchdog_pid = os.fork()
    if watchdog_pid == 0:
        _watch(worker_pid)  # never returns
    return watchdog_pid


def stop_handler(
    stop: Callable[[], None], leave: Callable[[int], None], bound_s: float = ORPHAN_STOP_S
) -> Callable[..., None]:
    """A SIGTERM / SIGINT handler: `stop` (the graceful stop); and if the parent is gone (its
    death sent this signal), `leave(1)` after `bound_s` unless the stop ended first. The
    handlers made with one `leave` share one bound, also armed by a thread once the parent is
    gone, whether or not a handler ever runs."""
    bound = _bounds.get(leave) or _bounds.setdefault(leave, _OrphanBound(leave, bound_s))

    def handler(*_: Any) -> None:
        stop()
        bound.arm()

    return handler


class _OrphanBound:
    """`leave(1)` after bound_s, armed once, from the first to see the parent gone."""

    def __init__(self, leave: Callable[[int], None], bound_s: float) -> None:
        self.leave = leave
        self.bound_s = bound_s
        self.timer: threading.Timer | None = None
        self._arming = threading.Lock()
        if _parent[0]:  # 0: install() never ran (forks first: no thread before it)
            threading.Thread(
                target=self._watch_parent, args=(_parent[0],), name="orphan-bound", daemon=True
            ).start()

    def arm(self) -> None:
        with self._arming:
            if self.timer is None and _parent[0] and os.getppid() != _parent[0]:
                self.timer = threading.Timer(self.bound_s, self.leave, args=(1,))
                self.timer.daemon = True
                self.timer.start()

    def _watch_parent(self, parent: int) -> None:
        while _parent[0] == parent and os.getppid() == parent:  # (tests change _parent)
            time.sleep(PARENT_POLL_S)
        self.arm()


# one bound per `leave`: the SIGTERM and SIGINT handlers of a worker share it, and its thread
_bounds: dict[Callable[[int], None], _OrphanBound] = {}


def _watch(worker_pid: int) -> None:
    group = os.getpgid(0)

    def kill_group(*_: object) -> None:
        os.killpg(group, signal.SIGKILL)  # includes this process
        os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(WATCHDOG_SIGNAL, kill_group)
    set_parent_death_signal(WATCHDOG_SIGNAL)
    if os.getppid() != worker_pid:
        kill_group()
    while True:
        signal.pause()
