"""What the worker does with a run spec, once per run: check that our copy of the run's data is
the run's, tell the control process the run's states this node holds, and time the run's model
for the planner. A spec the control process sends ahead of any plan is handled off the IPC
reader's thread once the worker is up; one that comes with a plan, at once, before any step.
Only a run sent ahead is timed: the control process always sends it ahead of its plans and its
planner reads the timing; a harness that sends its plan with the spec and nothing ahead
(harness/direct_swarm.py) places the peers itself, and a timing nobody reads cost each of its
workers a second of CPU at the plan's arrival, when every worker starts its first step. Nor is
a run timed that its planner does not price on compute (`compute_aware = false`, a random
placement: control/planning/compute.py reads no timing then; every `p2ptrain local` run, whose
peers share one machine's cores): each of its workers saves that second at its start.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import torch

from p2ptrain.errors import UserError
from p2ptrain.records import ComputeReport, RunSpec
from p2ptrain.worker.resume.saved_report import saved_report
from p2ptrain.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from p2ptrain.worker.ipc import IpcClient, PlanInbox

log = logging.getLogger("p2ptrain.worker")


class RunIntake:
    """The worker's checks and measurements of each run spec it is given (main.py's Worker)."""

    def __init__(self, settings: WorkerSettings, device: torch.device, inbox: PlanInbox) -> None:
        self.settings = settings
        self.device = device
        self.inbox = inbox  # stopped if the run is refused before any plan
        # set once connected, before the worker is up: None for a static plan
        self.ipc: IpcClient | None = None
        self._timed_runs: set[str] = set()
        self._runs_ahead: set[str] = set()  # runs the control process sent ahead of any plan
        self._told_runs: set[str] = set()  # runs whose saved states we told the control process
        self._checked_data: set[tuple[str, str, str]] = set()  # (run, data, digest) found right
        self.refused = ""  # why this worker will not train the run (its data is not the run's)
        self._timing = threading.Lock()
        # the saved states are told once our hello is (the planner's first plan waits for them);
        # the compute probe waits for our whole start (torch warm too): it would time us slow
        self._hello_sent = threading.Event()
        self._ready = threading.Event()

    def hello_sent(self) -> None:
        """Our hello is out: a spec that came ahead of it gets its saved states told now."""
        self._hello_sent.set()

    def worker_is_up(self) -> None:
        """The worker's start is done: a spec that came ahead of it is timed now."""
        self._hello_sent.set()
        self._ready.set()

    def on_run(self, spec: RunSpec) -> None:
        """The run spec ahead of any plan: tell its saved states once our hello is out, time its
        model once we are up, off the IPC reader's thread."""
        self._runs_ahead.add(spec.run_id)  # on the reader's thread: before the plan that follows

        def probe() -> None:
            self._hello_sent.wait()
            try:
                self.check_data(spec)
            except UserError as exc:  # refused: the worker stops before any plan
                self.refused = str(exc)
                log.error("%s", exc)
                self.inbox.stop()
                return
            self.tell_saved(spec)
            self._ready.wait()
            self.time_compute(spec)

        threading.Thread(target=probe, name="compute-probe", daemon=True).start()

    def check_data(self, spec: RunSpec) -> None:
        """The run pins its data (data_sha256): check ours once per run, before we time or
        train anything; UserError, naming both digests, if it differs, or if the data is not
        ours to read (worker/node_paths.py)."""
        from p2ptrain.train.data import check_digest, load_tokens
        from p2ptrain.worker.node_paths import node_spec

        spec = node_spec(spec, self.settings, self.ipc is not None)
        key = (spec.run_id, spec.data.source, spec.data.data_sha256)
        if not spec.data.data_sha256 or key in self._checked_data:
            return
        check_digest(spec, load_tokens(spec))
        self._checked_data.add(key)

    def tell_saved(self, spec: RunSpec) -> None:
        """Once per run: tell the control process the run's states we hold (saved_report.py):
        the planner's first plan waits for every trainer's word on them."""
        from p2ptrain.worker.node_paths import place_checkpoints

        if self.ipc is None:
            return  # a static plan has no planner to tell
        with self._timing:
            if spec.run_id in self._told_runs:
                return
            self._told_runs.add(spec.run_id)
            own = self.settings.checkpoint_dir
            self.ipc.send(saved_report(place_checkpoints(spec, own), own))

    def time_compute(self, spec: RunSpec) -> None:
        """Once per run sent ahead (the module's docstring): tell the saved states (if not yet
        told), then time the run's model (a second at most): the planner prices our stages from
        it."""
        from p2ptrain.worker.compute_probe import measure_stage_compute

        if self.ipc is None or spec.run_id not in self._runs_ahead:
            return  # a static plan, or a harness's: no planner reads it
        self.tell_saved(spec)
        if not spec.swarm.prices_compute:
            return  # its planner reads no timing
        with self._timing:
            if spec.run_id in self._timed_runs:
                return
            self._timed_runs.add(spec.run_id)
            compute = measure_stage_compute(spec, self.device)
        log.info("timed the run's model: %.3g ms per row and block", compute.block_row_s * 1e3)
        self.ipc.send(ComputeReport(compute))
