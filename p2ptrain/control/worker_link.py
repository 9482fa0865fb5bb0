"""The bridge to this peer's worker over the IPC socket (ipc.IpcServer).

From the worker: `hello` (its data-plane addresses, announced in our peer record), `metrics`
(gossiped in our telemetry, and printed as a progress line on stdout: control/progress.py) and
`heartbeat`, `saved` (the run's states it holds: named in our record); each one feeds the worker's health watch
(control/health.py). To the worker: every plan the view accepts (with the run spec), and
`stop` on shutdown. The messages are records/messages.py's.

A plan's data-plane addresses are the planner's copy of each peer's: the worker is handed, for
each peer, only those its own signed record declares, so no planner can aim every worker at
endpoints no peer announced.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from p2ptrain.control.ipc import IpcServer
from p2ptrain.control.progress import progress_line
from p2ptrain.control.state import NodeState
from p2ptrain.net.framing import TRAFFIC
from p2ptrain.records import (
    ComputeReport,
    CopyReport,
    Heartbeat,
    Hello,
    Message,
    MetricsReport,
    PeerMetrics,
    Plan,
    PlanMessage,
    RunMessage,
    RunSpec,
    SavedReport,
    StartReport,
    Stop,
)

log = logging.getLogger(__name__)
# what our status line says of our worker's last step, as the worker reported it
AS_REPORTED = (
    "step",
    "loss",
    "tokens_per_s",
    "stage",
    "replica",
    "bytes_sent",
    "bytes_received",
    "step_s",
    "start_step",
    "start_lineage",
    "resume_never",
)


class WorkerLink:
    """The control side of the control <-> worker IPC."""

    def __init__(
        self,
        state: NodeState,
        ipc_path: str,
        print_progress: bool = True,
        routes: Callable[[Plan], Awaitable[dict[str, tuple[str, ...]]]] | None = None,
    ) -> None:
        """print_progress: print a line per step of the worker on stdout (control/progress.py);
        routes(plan): the local routes our worker dials some of the plan's peers at instead
        (control/traversal.py)."""
        self.state = state
        self.routes = routes
        self.print_progress = print_progress
        self.ipc = IpcServer(ipc_path, self._on_message)
        self.averaging: dict[str, int] = {}  # our worker's rounds by outcome, for telemetry

    async def serve_worker(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the socket (started once it listens) and send each new plan to the worker."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.ipc.serve)
            nursery.start_soon(self._serve_plans)
            task_status.started()

    async def stop_worker(self) -> None:
        """Ask a connected worker to checkpoint and exit."""
        await self.ipc.send(Stop(), wait=True)

    def _on_message(self, message: Message) -> None:
        """One message from the worker (decoded and validated by the IPC server)."""
        state = self.state
        now = state.clock()
        if isinstance(message, Hello):
            state.worker.heard(now, (0, 0, "waiting", 0))
            if message.peer_id != state.peer_id:
                log.warning(
                    "worker reports peer id %s, control is %s", message.peer_id, state.peer_id
                )
            state.data_addrs = list(message.data_addrs)
            state.publish_soon("record")
            log.info("worker is up with data addresses %s", state.data_addrs)
        elif isinstance(message, Heartbeat):
            state.worker.heard(now, (message.term, message.epoch, message.phase, message.step))
        elif isinstance(message, MetricsReport):
            # a step done: the worker is training the next one
            state.worker.heard(now, (message.term, message.epoch, "training", message.step + 1))
            self.averaging[message.averaging] = self.averaging.get(message.averaging, 0) + 1
            # probes during our outer round measure its traffic (control/round_watch.py)
            state.view.links.rounds.note(message.plan_key, message.outer_round, now)
            state.view.own_metrics = PeerMetrics(
                **{name: getattr(message, name) for name in AS_REPORTED},
                averaging=dict(self.averaging),  # the outcomes so far, not this step's
                control_bytes_sent=TRAFFIC.sent,
                control_bytes_received=TRAFFIC.received,
                relay_bytes=state.relay.bytes_relayed,
            )
            if self.print_progress:
                print(progress_line(message), flush=True)
        elif isinstance(message, CopyReport):
            # a spare's copy duties: on its metrics (a trainer's next report has none)
            metrics = state.view.own_metrics or PeerMetrics()
            state.view.own_metrics = dataclasses.replace(
                metrics, copies=message.copies, copies_plan=(message.term, message.epoch)
            )
        elif isinstance(message, StartReport):
            # members our worker's start agreement never heard: gossiped with our metrics for
            # that plan (a trainer's next step report has none), the planner judges them
            metrics = state.view.own_metrics or PeerMetrics()
            state.view.own_metrics = dataclasses.replace(
                metrics, silent=message.silent, silent_plan=(message.term, message.epoch)
            )
            state.publish_soon("telemetry")
        elif isinstance(message, SavedReport):
            # named in our record once we know its run is ours (a restarted control process
            # hears it before it knows the run): a restart's first plan waits for the rest
            state.saved = message
            state.publish_soon("record")
        elif isinstance(message, ComputeReport):
            state.stage_compute = message.compute
            state.publish_soon("record")  # the planner prices our stages from it
            log.info(
                "worker timed the run's model: %.3g ms per row and block on %s (%s)",
                message.compute.block_row_s * 1e3,
                message.compute.device,
                message.compute.precision or "?",  # what its passes compute in for this run
            )
        else:
            log.warning("ipc: ignoring a %s message from the worker", message.TYPE)

    async def _serve_plans(self) -> None:
        """Hand the run spec and each new plan to the worker as soon as the view holds them
        (woken by control/events.py), once we joined (we then know the run)."""
        state, view = self.state, self.state.view
        sent_version = 0
        sent_run: RunSpec | None = None
        sent_plan: Plan | None = None
        await state.joined.wait()
        while True:
            seen = state.changes.count("plan", "run", "members")
            if view.run is not None and view.run != sent_run:
                # before any plan: the worker times the run's model for the planner
                sent_run = view.run
                await self.ipc.send(RunMessage(view.run))
                if state.saved is not None:  # heard before the run: our record may name it now
                    state.publish_soon("record")
            new = view.plan_version != sent_version
            # a plan sent with addresses cut (a record we had not yet seen) is sent again, as
            # the records arrive, until every address is there
            if view.plan is not None and (new or sent_plan is not view.plan):
                plan = declared_data_addrs(view.plan, state)
                if new or plan != sent_plan:
                    sent_version, sent_plan = view.plan_version, plan
                    routes = {} if self.routes is None else await self.routes(view.plan)
                    await self.ipc.send(PlanMessage(plan, view.run, routes))
            await state.changes.wait(("plan", "run", "members"), seen)


def declared_data_addrs(plan: Plan, state: NodeState) -> Plan:
    """`plan` with each other peer's data addresses cut to those its own record declares."""
    kept: dict[str, tuple[str, ...]] = {}
    for peer, addrs in plan.data_addrs.items():
        member = state.view.members.get(peer)
        if peer == state.peer_id:
            kept[peer] = tuple(addrs)
        else:
            declared = set(member.record.data_addrs) if member is not None else set()
            kept[peer] = tuple(a for a in addrs if a in declared)
    dropped = sorted(p for p in kept if kept[p] != tuple(plan.data_addrs[p]))
    if not dropped:
        return plan
    log.warning("plan data addresses %s's record does not declare: dropped", ", ".join(dropped))
    return plan.replace(data_addrs=kept)
