"""The worker's health as its control process hears it (control/health.py judges by it): a
heartbeat every HEARTBEAT_INTERVAL_S from a thread of its own, whatever the trainer is doing,
with the worker's phase, its session's step and the plan the phase concerns; and, on the same
thread, the watch on hivemind's DHT process, whose death stops the worker (its p2pd, which has no
parent-death signal, would live on)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from p2ptrain.records import Heartbeat, Plan

if TYPE_CHECKING:
    import hivemind

    from p2ptrain.worker.ipc import IpcClient, PlanInbox

log = logging.getLogger("p2ptrain.worker")

HEARTBEAT_INTERVAL_S = 2.0
# after hivemind's DHT process died: as long as a supervisor gives a stopping worker
DHT_LOST_EXIT_S = 10.0


class Pulse:
    """The worker's phase, the DHT it watches and why it stopped on its own, if it did."""

    def __init__(
        self, inbox: PlanInbox, leave: Callable[[int], None], step: Callable[[], int]
    ) -> None:
        self.inbox = inbox
        self._leave = leave  # ends the process with an exit code, from any thread
        self._step = step  # the current session's step (0 between sessions)
        self.phase = "starting"  # records/messages.py PHASES; with the plan it concerns
        self.phase_plan: Plan | None = None
        self.dht: hivemind.DHT | None = None  # while it should be alive (check_dht)
        self.failure = ""  # why the worker stopped on its own (its DHT process died)

    def beat(self, ipc: IpcClient) -> None:
        """Heartbeats to the control process from now on, from a thread of their own."""
        threading.Thread(
            target=self._beat_forever, args=(ipc,), name="heartbeat", daemon=True
        ).start()

    def fail(self, why: str) -> None:
        """Stop on our own (exit code 1), saying why."""
        self.failure = why
        log.error("%s: stopping the worker", why)
        self.inbox.stop()

    def stop_code(self) -> int:
        return 1 if self.failure else 0

    def check_dht(self) -> None:
        """hivemind's DHT process died: the data plane is gone, but its p2pd lives on. Stop as on
        SIGTERM (checkpoint, exit 1), or, should the trainer hang on the dead DHT, leave anyway:
        the watchdog then kills p2pd and the rest of the group."""
        dht = self.dht  # None again before the worker shuts it down: that end is no failure
        if dht is None or dht.is_alive() or self.dht is None or self.failure:
            return
        self.fail(f"hivemind's DHT process died (exit code {dht.exitcode})")
        timer = threading.Timer(DHT_LOST_EXIT_S, self._leave, args=(1,))
        timer.daemon = True
        timer.start()

    def _beat_forever(self, ipc: IpcClient) -> None:
        while not self.inbox.stopped:
            self.check_dht()  # here: this thread runs whatever the trainer is doing
            plan = self.phase_plan
            term, epoch = (0, 0) if plan is None else plan.key
            ipc.send(Heartbeat(self.phase, self._step(), term, epoch))
            time.sleep(HEARTBEAT_INTERVAL_S)
