"""No orphans: hivemind's children and p2pd must never outlive the worker.

hivemind forks a DHT process and an averager process, and the DHT process starts `p2pd`; all stay
in the worker's process group, and all survive a SIGKILL of the worker (measured with hivemind 1.1.12).
So the worker (1) leads its own process group, (2) asks the kernel to signal it when its parent
dies (PR_SET_PDEATHSIG), and (3) forks a tiny watchdog child, before any thread exists, whose only
job is to SIGKILL the whole group the moment the worker dies, however it dies.
"""

from __future__ import annotations

import os
import signal

from p2ptrain.procs import set_parent_death_signal

# the watchdog's parent-death signal: not SIGTERM, which a supervisor may send the whole group
# for a graceful stop (the worker must be free to checkpoint first)
WATCHDOG_SIGNAL = signal.SIGUSR2


def install(parent_death_signal: int = signal.SIGTERM) -> int:
    """Lead a process group, die with the parent, start the group-killing watchdog; its pid."""
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    parent = os.getppid()
    set_parent_death_signal(parent_death_signal)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), parent_death_signal)
    worker_pid = os.getpid()
    watchdog_pid = os.fork()
    if watchdog_pid == 0:
        _watch(worker_pid)  # never returns
    return watchdog_pid


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
