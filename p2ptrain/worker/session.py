"""Training under one plan: this peer's stage, its optimizer, its averaging swarm, its loop.

A session ends when the run's last step is done, when a newer plan arrives (checkpoint, then the
worker starts a new session, possibly for another stage), when a neighbour is lost, or on stop.
Every end except a crash writes the stage checkpoint, so the next session resumes from it.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

import torch
from hivemind import DHT

from p2ptrain.records import Plan, Role, RunSpec, WorkerReport
from p2ptrain.train.checkpoint_folder import checkpoint_dir
from p2ptrain.train.data import load_corpus
from p2ptrain.train.model import Stage, build_layers
from p2ptrain.train.optim import clip_grads, grads_are_finite, lr_at, make_optimizer, set_lr
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.spike_clip import SpikeClip
from p2ptrain.worker.averaging.outer_link import close_rounds
from p2ptrain.worker.device import precision_for
from p2ptrain.worker.faults import NO_FAULTS, Faults
from p2ptrain.worker.ipc import PlanInbox
from p2ptrain.worker.pipeline import stage_step
from p2ptrain.worker.pipeline.frames import Expected, FrameHeader, PeerLost, Stopped
from p2ptrain.worker.pipeline.transport import Transport
from p2ptrain.worker.plan_peers import connect_to_plan_peers
from p2ptrain.worker.profiler import NO_PROFILE, StepProfiler
from p2ptrain.worker.replica_rounds import StageReplicas, open_replicas
from p2ptrain.worker.resume.restore import restore_stage, start_lineage, started_line
from p2ptrain.worker.resume.start_step import RESUME_TIMEOUT_S, StartPoint, agree_on_plan_start
from p2ptrain.worker.stage_saves import interval_save_due, keeps_one_back, stage_write
from p2ptrain.worker.state_writer import StateWriter
from p2ptrain.worker.step_metrics import SessionFacts, StepTimes, step_metrics

log = logging.getLogger("p2ptrain.worker")


class SessionEnd(enum.Enum):
    DONE = "done"  # every step of the run is trained
    NEW_PLAN = "new_plan"
    PEER_LOST = "peer_lost"
    STOPPED = "stopped"
    SPARE = "spare"  # the plan leaves this peer out


class Session:
    def __init__(
        self,
        spec: RunSpec,
        plan: Plan,
        dht: DHT,
        transport: Transport,
        inbox: PlanInbox,
        report: Callable[[WorkerReport], None],
        plan_version: int = 0,
        faults: Faults = NO_FAULTS,
        identity_seed: bytes = b"",
        device: torch.device | None = None,
        profiler: StepProfiler = NO_PROFILE,
    ) -> None:
        self.spec = spec
        self.device = device or torch.device("cpu")
        self.precision = precision_for(self.device, spec.optim.loss_scale)
        self.identity_seed = identity_seed  # signs this peer's start-step announcements
        self.faults = faults
        self.profiler = profiler  # where each step's CPU went: a no-op unless --profile
        self.plan = plan
        self.plan_version = plan_version
        self.failed = ""  # why this session cannot train (then train() ends it at once)
        self._previous: StageSnapshot | None = None  # the state one step back, see close()
        self.spikes = SpikeClip(spec.optim.spike_clip)  # before a round: train/spike_clip.py
        self._keeps_one_back = False
        self.transport = transport
        self.inbox = inbox
        self.report = report
        self.role: Role | None = plan.role_of(transport.peer_id)
        self.step = 0
        self.start_step: int | None = None  # the agreed start, once the members agreed
        self.started_from = ""  # where the plan started: "resumed from step N (lineage ...)"
        self.model: Stage | None = None
        self.replicas = StageReplicas()  # until the stage's are opened: every step "solo"
        self.directory = checkpoint_dir(spec)
        # an accelerator's host CPU writes checkpoints beside the steps; a CPU device's would
        # take that CPU from the steps themselves (worker/state_writer.py)
        self.writer = StateWriter(self.directory, spec, beside=self.device.type != "cpu")
        self.spare_start: StartPoint | None = None  # what a spare may owe: resume/handover.py
        if self.role is None:
            if transport.peer_id in plan.spares:  # it may hold a stage's only state: it agrees
                # and serves (resume/state_transfer.py), then idles
                connect_to_plan_peers(plan, dht, transport, self._superseded)
                self.spare_start = self._agree_on_start(dht)
            return
        role = self.role
        started_s = time.monotonic()
        connect_to_plan_peers(plan, dht, transport, self._superseded)
        log.info("connected to the plan's peers in %.1f s", time.monotonic() - started_s)
        # before the model is built: a slow machine's build ran into its mates' wait for it
        start = self._agree_on_start(dht)
        if start is None:
            self.failed = "the plan's members did not agree on a start step"
            return
        self.model = build_layers(spec, plan.layer_ranges(spec.model.n_layer)[role.stage])
        self.model.to(self.device)  # before the optimizer: its state lives beside the weights
        self.optimizer = make_optimizer(self.model, spec)
        outer_state: dict[str, torch.Tensor] = {}
        restored = restore_stage(
            spec, plan, transport, self.directory, self.model, self.optimizer, start, outer_state
        )
        self.step, lost = restored.step, restored.lost  # lost: said, not "resumed"
        self.started_from = started_line(spec, plan, start, self.directory, lost)
        self.start_lineage = "" if lost else start_lineage(plan, start)
        needs_data = role.is_first or role.is_last
        self.corpus = load_corpus(spec) if needs_data else None
        self.replicas = open_replicas(
            spec, plan, role, dht, transport, self.model, profiler, self.faults
        )
        if self.replicas.outer is not None:  # sync = "diloco"
            self.replicas.outer.take_saved(outer_state)
        self.rows = stage_step.replica_batch(spec, role)[1]
        stage_step.warm_up(self.model, spec, role, self.precision)
        self.start_step = self.step
        self._keeps_one_back = keeps_one_back(spec, role)  # for its last save (stage_saves.py)
        fresh = self.started_from.startswith('resume = "never"')
        num_rows, block_size = len(self.rows), spec.model.block_size
        self.facts = SessionFacts(
            role, plan.term, num_rows, block_size, self.step, self.start_lineage, fresh
        )
        log.info(
            "plan epoch %d: stage %d/%d (layers %s) of replica %d/%d, starting at step %d",
            role.epoch,
            role.stage,
            role.num_stages,
            self.model.layers,
            role.replica,
            role.num_replicas,
            self.step,
        )

    def _agree_on_start(self, dht: DHT) -> StartPoint | None:
        """Every peer of the plan, spares too, announces its states; all pick one (start_step.py)."""
        log.info("agreeing with the plan's peers on a start step (up to %.0f s)", RESUME_TIMEOUT_S)
        return agree_on_plan_start(
            dht,
            self.spec,
            self.plan,
            self.directory,
            self.identity_seed,
            self.transport.peer_id,
            self._superseded,
            self.report,  # members silent in it: the planner plans around them
        )

    def _superseded(self) -> bool:
        return self.inbox.stopped or self.inbox.version != self.plan_version

    def expect(self, header: FrameHeader) -> Expected | None:
        """Called from the transport thread for every incoming frame."""
        if self.role is None or self.start_step is None:
            return None  # a session that failed to start expects nothing: refused, not a crash
        return stage_step.accepted_frame(self.spec, self.role, self.step, self.start_step, header)

    def train(self, plan_version: int) -> SessionEnd:
        """Train step by step until the run's last step, a stop, a new placement or a lost peer."""
        self.plan_version = plan_version
        if self.failed:
            log.warning("%s", self.failed)
            return SessionEnd.PEER_LOST
        if self.role is None or self.model is None:
            log.info("the plan leaves this peer out: waiting as a spare")
            return SessionEnd.SPARE
        # frames a neighbour of an earlier plan sent (for steps this plan re-runs) are never ours
        self.transport.inbox.forget(self.role.plan_key, self.step)
        while self.step < self.spec.optim.steps:
            end = self._interrupted()
            if end is not None:
                return end
            times, timing = StepTimes(), stage_step.StageTiming()
            self.profiler.step_started()
            set_lr(self.optimizer, lr_at(self.step, self.spec))
            times.passes_s = time.monotonic()
            self.profiler.passes_started()
            try:
                loss = self._passes(timing)
            except (Stopped, PeerLost) as exc:
                return self._abandon_step(exc)
            times.averaging_s = time.monotonic()
            self.profiler.round_started(timing)
            averaging = self.replicas.average_gradients(
                self.model, self.role, self.step, self._should_stop
            )
            times.update_s = time.monotonic()
            self.profiler.round_ended(self.replicas.wire_cpu)
            end = self._unappliable(averaging)
            if end is not None:
                return end
            self._update()
            self.replicas.outer_round_if_due(self.step, self._should_stop)
            self._report_step(loss, averaging, times, timing)
            self.step += 1
            self.transport.inbox.forget(self.role.plan_key, self.step)
            self._checkpoint_if_due()
        return SessionEnd.DONE

    def _interrupted(self) -> SessionEnd | None:
        """A stop, or a newer plan placing peers differently, ends the session before a step."""
        if self.inbox.stopped:
            return SessionEnd.STOPPED
        if self.inbox.version != self.plan_version:
            if self._placement_changed():
                return SessionEnd.NEW_PLAN
            self.plan_version = self.inbox.version
        return None

    def _passes(self, timing: stage_step.StageTiming) -> float | None:
        """The stage's forward and backward passes over the step's micro-batches: gradients in
        place, unscaled, a spike of ours clipped (spike_clip); the loss on a pipeline's last
        stage."""
        assert self.model is not None and self.role is not None
        loss = stage_step.run_step(
            self.model,
            self.spec,
            self.role,
            self.transport,
            self.corpus,
            self.step,
            self._should_stop,
            self.plan.network,
            timing,
            self.precision,
        )
        stage_step.unscale_grads(self.model, self.spec)
        if (scale := self.spikes.clip(self.model)) is not None:
            log.info("step %d: our gradient spiked: clipped to %.2g of its norm", self.step, scale)
        return loss

    def _abandon_step(self, exc: Stopped | PeerLost) -> SessionEnd:
        """The passes could not finish: the step's gradients are dropped."""
        self.optimizer.zero_grad(set_to_none=True)
        if isinstance(exc, Stopped):
            return SessionEnd.STOPPED
        log.warning("step %d: %s", self.step, exc)
        return SessionEnd.PEER_LOST

    def _unappliable(self, averaging: str) -> SessionEnd | None:
        """After the round: end the session without applying the step if we were stopped while
        averaging, or if the group broke and a new plan is already here (the swarm re-runs this
        step under it, worker/resume/start_step.py: a local-only update would only diverge)."""
        end = None
        if averaging == "stopped" and self.inbox.stopped:
            end = SessionEnd.STOPPED
        elif averaging in ("local", "stopped") and self._placement_changed():
            log.info("step %d: averaging failed and a new plan arrived: not applied", self.step)
            end = SessionEnd.NEW_PLAN
        if end is not None:
            self.optimizer.zero_grad(set_to_none=True)
        return end

    def _update(self) -> None:
        """Clip and apply the (averaged) gradient; re-sync the replicas if they diverged."""
        assert self.model is not None
        clip_grads(self.model, self.spec.optim.grad_clip)
        if self._keeps_one_back:  # close() saves it too (worker/resume/start_step.py)
            previous, outer = self._previous, self.replicas.outer_state()  # reused: no allocation
            self._previous = StageSnapshot.take(
                self.model, self.optimizer, self.step, outer, reuse=previous, lasting=True
            )
        if grads_are_finite(self.model):
            self.optimizer.step()
        else:  # the stage keeps its weights; a drift from its replicas is re-synced later
            log.warning("step %d: non-finite gradients: the update is skipped", self.step)
        self.optimizer.zero_grad(set_to_none=True)
        self.replicas.resync_if_diverged(self.model, self.optimizer, self.step)

    def _report_step(
        self, loss: float | None, averaging: str, times: StepTimes, timing: stage_step.StageTiming
    ) -> None:
        """The operator's metrics of the step, then its profile if the profiler makes one."""
        assert self.role is not None
        profile = self.profiler.step_ended(self.step, self.role, timing)
        traffic = self.transport.traffic
        metrics = step_metrics(
            self.facts, self.step, loss, averaging, self.replicas.group_size, traffic, times, timing
        )
        metrics = self.replicas.reported(metrics)  # the progress line shows any outer rounds
        self.report(metrics)
        if profile is not None:
            self.report(profile)

    def _checkpoint_if_due(self) -> None:
        if interval_save_due(self.spec, self.step):
            self.save()

    def _should_stop(self) -> bool:
        return self.inbox.stopped or self._placement_changed()

    def _placement_changed(self) -> bool:
        """Does the newest plan place peers differently from ours? (Then this session ends.)"""
        latest = self.inbox.latest
        if self.inbox.version == self.plan_version or latest is None:
            return False
        return not latest.plan.same_placement(self.plan)

    def save(self, at_end: bool = False) -> None:
        """The stage's state at the current step boundary (which states: worker/stage_saves.py),
        by worker/state_writer.py; a session's last save (`at_end`) is on disk when this returns."""
        if at_end:
            self.writer.wait()  # a periodic save still being written lands first
        if self.model is None or self.failed:
            return
        previous = self._previous if at_end else None
        outer = self.replicas.outer_state()
        write = stage_write(self.model, self.optimizer, self.step, outer, previous, self.plan)
        if at_end:
            self.writer.write_now(write)
        else:
            self.writer.submit(write)

    def close(self) -> None:
        """Checkpoint (weights are always those of the last completed step) and leave the swarm;
        what the session held goes whatever happens, so the next one is built beside none of it."""
        try:
            self.replicas.end_rounds()  # a round still running ends (stop or timeout) first
            close_rounds(self.transport)  # this group's members park outer messages no more
            self.save(at_end=True)  # a failed write is logged (state_writer.py), not raised
        finally:
            self.replicas.close()  # its averager and outer rounds go with it
            self.model = self.corpus = self._previous = None
            if hasattr(self, "optimizer"):  # a spare's session has none
                self.optimizer.state.clear()  # the moments: twice the stage's weights
