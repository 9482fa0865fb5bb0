"""The worker process: the data plane of one node (torch + hivemind).

    python -m p2ptrain.worker --ipc SOCKET [--identity KEY]       # beside a control process
    python -m p2ptrain.worker --plan PLAN.json --name NAME        # static plan, for tests

Life of the process: watchdog -> temp folder -> hivemind DHT + p2pd (the data-plane address) ->
hello -> wait for a plan -> build this peer's stage -> train step by step (pipeline, then verified
averaging, then the optimizer) -> checkpoint on interval, on a new plan and on exit.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain import addresses, identity
from p2ptrain.errors import UserError
from p2ptrain.records import (
    CopyReport,
    Hello,
    MetricsReport,
    Plan,
    PlanMessage,
    RunSpec,
    SessionReport,
    StartReport,
    WorkerReport,
)
from p2ptrain.train.checkpoint_folder import checkpoint_dir
from p2ptrain.worker import collector, daemon_env, static_plan, watchdog
from p2ptrain.worker.averaging.outer_link import finish_sends
from p2ptrain.worker.device import precision_note, resolve_device
from p2ptrain.worker.pipeline.frames import Expected, FrameHeader, NotReady
from p2ptrain.worker.plan_readiness import why_not_actionable
from p2ptrain.worker.process_life import exit_process, run_bounded, set_up_process, warm_up_torch
from p2ptrain.worker.pulse import Pulse
from p2ptrain.worker.run_intake import RunIntake
from p2ptrain.worker.settings import WorkerSettings

if TYPE_CHECKING:
    import hivemind

    from p2ptrain.worker.pipeline.transport import Transport
    from p2ptrain.worker.profiler import StepProfiler
    from p2ptrain.worker.resume.state_transfer import StateServer
    from p2ptrain.worker.session import Session, SessionEnd

log = logging.getLogger("p2ptrain.worker")

SHUTDOWN_GRACE_S = 3.0


def main(argv: list[str] | None = None) -> None:
    settings = WorkerSettings.from_argv(argv)
    leave = functools.partial(exit_process, set_up_process(settings))
    try:
        code = Worker(settings, leave).run()
    except UserError as exc:
        log.error("%s", exc)
        code = 2
    except Exception:  # a bug: exit all the same (sys.exit would wait for hivemind's threads)
        log.exception("the worker failed")
        code = 1
    leave(code)


class Worker:
    def __init__(self, settings: WorkerSettings, leave: Callable[[int], None] = os._exit) -> None:
        from p2ptrain.worker.ipc import IpcClient, PlanInbox

        self.settings = settings
        self._leave = leave  # ends the process with an exit code, from any thread
        self.device = resolve_device(settings.device)  # UserError if it is not here
        log.info("training on %s (%s)", self.device, precision_note(self.device))
        self.inbox = PlanInbox()
        self.runs = RunIntake(settings, self.device, self.inbox)
        self.current: Session | None = None  # the session whose frames are accepted
        self.pulse = Pulse(self.inbox, leave, self._step)  # phase, DHT watch, heartbeats
        self.ipc: IpcClient | None = (
            IpcClient(settings.ipc, self.inbox, on_run=self.runs.on_run) if settings.ipc else None
        )
        self.runs.ipc = self.ipc  # its probes wait for our start: it is set by then
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, watchdog.stop_handler(self.inbox.stop, self._leave))
        if self.ipc is not None:
            self.pulse.beat(self.ipc)

    def run(self) -> int:
        from p2ptrain.worker.dht_gate import start_gated_dht
        from p2ptrain.worker.dht_helpers import AnnouncementValidator
        from p2ptrain.worker.node_paths import node_spec
        from p2ptrain.worker.pipeline.transport import Transport
        from p2ptrain.worker.resume.copy_server import CopyServer
        from p2ptrain.worker.resume.state_transfer import StateServer
        from p2ptrain.worker.session import SessionEnd

        seed = self._seed()
        key_copy = identity.DaemonKeyCopy(seed, self.settings.identity)
        daemon_env.use_for_daemons()
        try:  # nobody served until a plan names its peers (worker/dht_gate.py)
            settings = self.settings
            validators = [AnnouncementValidator()]
            dht = start_gated_dht(
                settings.listen_maddr, list(settings.announce), str(key_copy.path), validators
            )
        finally:
            key_copy.remove()
        self.pulse.dht = dht
        transport = Transport.start(dht.replicate_p2p, self._expect)
        state_server = StateServer(transport)
        CopyServer(state_server, transport.peer_id, transport, self._latest_plan)
        try:
            # p2pd reports every interface of a 0.0.0.0 listener, loopback included
            reported = [str(a) for a in dht.get_visible_maddrs()]
            data_addrs = addresses.expand(reported, addresses.interface_ip4s())
            log.info("data plane up: %s", data_addrs[0])
            self._hello(transport.peer_id, data_addrs)
            self.runs.hello_sent()
            self.pulse.phase = "waiting"
            warm_up_torch()
            self.runs.worker_is_up()
            version = 0
            while True:
                if not self.inbox.wait_newer(version):
                    # before any (new) plan
                    return 2 if self.runs.refused else self.pulse.stop_code()
                version = self.inbox.version
                message = self.inbox.latest
                assert message is not None
                if message.run is not None:
                    self.runs.check_data(message.run)  # before any step: UserError if not the run's
                    self.runs.time_compute(message.run)  # if it came ahead and is not yet timed
                problem = why_not_actionable(message, transport.peer_id)
                if problem or message.run is None:
                    log.info("waiting for a better plan: %s", problem)
                    continue
                spec = message.run
                transport.keep_routes(message.routes)
                # a static plan's spec is a local file; the control process's, the organiser's
                spec = node_spec(spec, self.settings, self.ipc is not None)
                end = self._run_session(message, spec, version, seed, dht, transport, state_server)
                if end is SessionEnd.DONE:
                    return 0
                if self.inbox.stopped:
                    return self.pulse.stop_code()
                if end is SessionEnd.PEER_LOST and not self.ipc:
                    return 3  # a static plan cannot heal; a control plane re-plans
                if self.inbox.version == version:  # else a new plan is here already
                    log.info("session ended (%s): waiting for the planner's next plan", end.value)
        finally:
            self._shut_down(transport, dht)

    def _run_session(
        self,
        message: PlanMessage,
        spec: RunSpec,
        version: int,
        seed: bytes,
        dht: hivemind.DHT,
        transport: Transport,
        state_server: StateServer,
    ) -> SessionEnd:
        """One session under plan `version`: built, trained (or a spare's wait), then closed."""
        from p2ptrain.worker.resume.copies import keep_copies
        from p2ptrain.worker.resume.handover import wait_until_fetched
        from p2ptrain.worker.session import Session, SessionEnd

        state_server.serve_run(spec, checkpoint_dir(spec), message.plan)
        self.pulse.phase, self.pulse.phase_plan = "joining", message.plan
        session = Session(
            spec,
            message.routed_plan(),
            dht,
            transport,
            self.inbox,
            self._report,
            version,
            self.settings.faults,
            seed,
            self.device,
            self._profiler(),
        )
        self.current = session  # from now on its frames are accepted
        collector.freeze_setup()
        self._report(SessionReport(message.plan, session.step))
        if session.spare_start is not None:  # "spare" once its only states are fetched
            wait_until_fetched(
                session.spare_start,
                message.plan,
                transport.peer_id,
                spec,
                state_server.served,
                functools.partial(self._superseded, version),
            )
        self.pulse.phase = "spare" if session.role is None else "training"
        try:
            end = session.train(version)
            if end is SessionEnd.SPARE:  # a lone holder's crash then costs steps only
                keep_copies(
                    spec,
                    message.plan,
                    transport,
                    checkpoint_dir(spec),
                    functools.partial(self._waited_superseded, version),
                    session.spare_start,
                    self._report,
                )
        finally:
            # a stopped session takes no more frames (the sender retries until our next
            # session, or gives up): one accepted now would be ACCEPTED and never used
            self.current, self.pulse.phase = None, "waiting"
            session.close()
            del session  # what it held is not kept through the wait for the next plan
            collector.thaw()
        return end

    def _shut_down(self, transport: Transport, dht: hivemind.DHT) -> None:
        self.pulse.dht = None  # before its shutdown: see Pulse.check_dht
        finish_sends(transport)  # a groupmate's last outer round may wait for our shard

        # hivemind's own shutdown can hang for long; give it a moment, then leave: the
        # watchdog kills whatever of the process group is left when we exit
        def shut_down() -> None:
            transport.close()
            dht.shutdown()

        run_bounded(shut_down, SHUTDOWN_GRACE_S)

    def _latest_plan(self) -> Plan | None:
        latest = self.inbox.latest
        return None if latest is None else latest.plan

    def _waited_superseded(self, version: int, wait_s: float) -> bool:
        """`_superseded`, after waiting up to `wait_s` for a newer plan or a stop."""
        self.inbox.wait_newer(version, wait_s)
        return self._superseded(version)

    def _superseded(self, version: int) -> bool:
        """Is the session of plan `version` over: the worker stopped, or a newer plan here?"""
        return self.inbox.stopped or self.inbox.version != version

    def _expect(self, header: FrameHeader) -> Expected | None:
        session = self.current
        if session is None:
            raise NotReady()  # between plans: the sender retries
        return session.expect(header)

    def _step(self) -> int:
        session = self.current
        return 0 if session is None else session.step

    def _profiler(self) -> StepProfiler:
        """A session's step hook: where each step's CPU went, only with --profile."""
        from p2ptrain.worker.profiler import NO_PROFILE, CpuProfiler

        return CpuProfiler() if self.settings.profile else NO_PROFILE

    def _report(self, message: WorkerReport | SessionReport | CopyReport) -> None:
        line = json.dumps(message.to_dict())
        if self.settings.metrics_log:  # what `p2ptrain local` follows, step by step
            with open(self.settings.metrics_log, "a") as f:
                f.write(line + "\n")
        if not isinstance(message, MetricsReport | CopyReport | StartReport):
            return  # the IPC contract has no other worker -> control message to carry them
        if self.ipc is not None:
            self.ipc.send(message)
        else:
            print(line, flush=True)

    def _hello(self, peer_id: str, data_addrs: list[str]) -> None:
        hello = Hello(peer_id, tuple(data_addrs), os.getpid())
        if self.ipc is not None:
            self.ipc.send(hello)
            return
        # a static plan (settings checked: --plan needs --name): hellos are files beside it
        plan, name = self.settings.plan, self.settings.name
        assert plan is not None and name is not None
        static_plan.rendezvous(Path(plan), name, hello, self.inbox, self.pulse.fail)

    def _seed(self) -> bytes:
        """The node's Ed25519 seed (p2pd gets it as identity.DaemonKeyCopy: same peer id).
        Without --identity, a fresh one: the worker signs its announcements with it."""
        if self.settings.identity:
            return identity.load_or_create_identity(self.settings.identity)
        return os.urandom(identity.SEED_NUM_BYTES)
