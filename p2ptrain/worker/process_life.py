"""The worker process's own life around its `Worker`: the process-wide setup that must come
first, torch's warm-up while the swarm forms, and an exit that hivemind cannot hold up."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import torch

from p2ptrain import procs
from p2ptrain.worker import allocator, daemon_env, watchdog
from p2ptrain.worker.device import cpu_threads
from p2ptrain.worker.private_tmp import PrivateTmp
from p2ptrain.worker.settings import WorkerSettings


def set_up_process(settings: WorkerSettings) -> PrivateTmp:
    """Everything process-wide, in the order it needs; the private temp folder is in use."""
    watchdog.install()  # first, while the process has a single thread
    procs.raise_open_file_limit()  # hivemind's p2pd and its peers' connections cost descriptors
    allocator.keep_freed_memory()  # before the first tensor: its pages are the heap's
    private = PrivateTmp(settings.ipc)  # before any temp file or socket: they go with it
    private.use()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s worker %(process)d: %(message)s",
    )
    quiet = logging.ERROR if settings.log_level.upper() != "DEBUG" else logging.DEBUG
    for noisy in ("hivemind", "hivemind.averaging", "hivemind.dht"):
        logging.getLogger(noisy).setLevel(quiet)
    daemon_env.quiet_routine_daemon_errors()
    torch.set_num_threads(cpu_threads(settings.threads))
    return private


def warm_up_torch() -> None:
    # the first optimizer imports torch._dynamo (1-4 s): pay it while the swarm is still forming
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


def exit_process(private: PrivateTmp, code: int) -> None:
    """End the process with exit `code`, from any thread, its temp folder removed first."""
    private.remove()
    logging.shutdown()
    os._exit(code)  # not sys.exit: hivemind's non-daemon threads must not keep us alive


def run_bounded(fn: Callable[[], object], timeout_s: float) -> None:
    """Run `fn` in a daemon thread, waiting for it `timeout_s` at most: a hang in it (hivemind's
    shutdown) cannot keep the process from its exit."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(timeout_s)
