"""Training under one plan: this peer's stage, its optimizer, its averaging swarm, its loop.

A session ends when the run's last step is done, when a newer plan arrives (checkpoint, then the
worker starts a new session, possibly for another stage), when a neighbour is lost, or on stop.
Every end except a crash writes the stage checkpoint, so the next session resumes from it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable

import torch
from hivemind import DHT

from p2ptrain.records import MetricsReport, Plan, Role, RunSpec
from p2ptrain.train.checkpoint import StageSnapshot, checkpoint_dir, record_step
from p2ptrain.train.data import load_corpus, replica_rows
from p2ptrain.train.model import Stage, build_layers
from p2ptrain.train.optim import clip_grads, grads_are_finite, lr_at, make_optimizer, set_lr
from p2ptrain.worker import pipeline
from p2ptrain.worker.averaging import StageAverager
from p2ptrain.worker.cpu_clock import TreeCpuClock, round_cpu_split
from p2ptrain.worker.device import precision_for
from p2ptrain.worker.dht_helpers import bootstrap_dht, swarm_prefix
from p2ptrain.worker.faults import NO_FAULTS, Faults
from p2ptrain.worker.frames import AlreadyHave, Expected, FrameHeader, NotReady, PeerLost, Stopped
from p2ptrain.worker.ipc import PlanInbox
from p2ptrain.worker.link_bounds import dial_window_s
from p2ptrain.worker.restore import restore_stage, start_lineage, started_line
from p2ptrain.worker.resume import StartPoint, agree_on_plan_start
from p2ptrain.worker.robust import MOMENTS_DRIFT_BOUND, PARAMS_DRIFT_BOUND
from p2ptrain.worker.transport import Transport

log = logging.getLogger("p2ptrain.worker")


AVERAGER_SHUTDOWN_S = 3.0


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
        report: Callable[[MetricsReport], None],
        plan_version: int = 0,
        faults: Faults = NO_FAULTS,
        identity_seed: bytes = b"",
        device: torch.device | None = None,
    ) -> None:
        self.spec = spec
        self.device = device or torch.device("cpu")
        self.precision = precision_for(self.device)
        self.identity_seed = identity_seed  # signs this peer's start-step announcements
        self.faults = faults
        self.plan = plan
        self.plan_version = plan_version
        self.failed = ""  # why this session cannot train (then train() ends it at once)
        self._previous: StageSnapshot | None = None  # the state one step back, see close()
        self._resync_params = False
        self._group_size = 1  # how many replicas the last step's gradient was averaged over
        self._wire_cpu: tuple[float, float] | None = None  # its round's parts' CPU marks
        self.transport = transport
        self.inbox = inbox
        self.report = report
        self.role: Role | None = plan.role_of(transport.peer_id)
        self.step = 0
        self.started_from = ""  # where the plan started: "resumed from step N (lineage ...)"
        self.model: Stage | None = None
        self.averager: StageAverager | None = None
        self.directory = checkpoint_dir(spec)
        self._cpu = TreeCpuClock()  # the process tree's CPU seconds, read around each round
        if self.role is None:
            if transport.peer_id in plan.spares:
                # a spare may hold the only copy of a stage's state: it takes part in the
                # agreement (and serves states, worker/state_transfer.py), then idles
                self._connect(plan, dht)
                self._agree_on_start(dht)
            return
        role = self.role
        started_s = time.monotonic()
        self._connect(plan, dht)
        log.info("connected to the plan's peers in %.1f s", time.monotonic() - started_s)
        self.model = build_layers(spec, plan.layer_ranges(spec.n_layer)[role.stage])
        self.model.to(self.device)  # before the optimizer: its state lives beside the weights
        self.optimizer = make_optimizer(self.model, spec)
        start = self._agree_on_start(dht)
        if start is None:
            self.failed = "the plan's members did not agree on a start step"
            return
        self.step = restore_stage(
            spec, plan, transport, self.directory, self.model, self.optimizer, start
        )
        self.started_from = started_line(spec, plan, start, self.directory)
        self.start_lineage = start_lineage(plan, start)
        needs_data = role.is_first or role.is_last
        self.corpus = load_corpus(spec) if needs_data else None
        if role.num_replicas > 1:
            num_params = sum(p.numel() for p in self.model.parameters())
            prefix = swarm_prefix(spec.run_id, role.stage, role.epoch, plan.term)
            # each replica's weight is its rows of the batch, as the plan fixes them
            weights = {peer: float(len(replica_rows(spec.batch_size, role.num_replicas, i)))
                       for i, peer in enumerate(role.stage_peers)}  # fmt: skip
            self.averager = StageAverager(
                dht,
                num_params,
                prefix,
                role.num_replicas,
                spec.compression,
                spec.averaging_timeout_s,
                group=weights,
                network=plan.network,
                stage=role.stage,
                traffic=transport.traffic,
            )
        self.rows = replica_rows(spec.batch_size, role.num_replicas, role.replica)
        self.start_step = self.step
        log.info(
            "plan epoch %d: stage %d/%d (layers %s) of replica %d/%d, starting at step %d",
            role.epoch, role.stage, role.num_stages, self.model.layers, role.replica,
            role.num_replicas, self.step,
        )  # fmt: skip

    def _connect(self, plan: Plan, dht: DHT) -> None:
        addrs = plan.data_addrs
        others = plan.peers() - {self.transport.peer_id}
        me = self.transport.peer_id
        unreachable = self.transport.connect_all(
            {p: addrs[p] for p in sorted(others) if addrs.get(p)},
            {p: dial_window_s(plan.link_facts(me, p)) for p in others},
        )
        if unreachable:
            log.warning("not connected to %s yet: going on (they may dial us)", unreachable)
        if others:  # the DHT carries resume announcements and averaging matchmaking
            bootstrap_dht(dht, sorted(others))

    def _agree_on_start(self, dht: DHT) -> StartPoint | None:
        """Every peer of the plan (spares too) announces its saved stage states; all pick one
        step, and the digest of each stage's state there (worker/resume.py)."""
        return agree_on_plan_start(
            dht, self.spec, self.plan, self.directory, self.identity_seed,
            self.transport.peer_id,
            lambda: self.inbox.stopped or self.inbox.version != self.plan_version,
        )  # fmt: skip

    def expect(self, header: FrameHeader) -> Expected | None:
        """Called from the transport thread for every incoming frame."""
        if self.role is None:
            return None
        if header.step > self.step + 1:
            raise NotReady()  # a neighbour resumed from a later checkpoint, or we are slow
        expected = pipeline.expected_frame(
            self.spec, self.role, self.step, header.kind, header.step, header.micro
        )
        if expected is None and header.step < self.step:
            # from the right neighbour for an earlier step of this session: a retried copy
            earlier = pipeline.expected_frame(
                self.spec, self.role, header.step, header.kind, header.step, header.micro
            )
            if (
                earlier is not None
                and earlier.sender == header.sender
                and (header.term, header.epoch) == self.role.plan_key
                and self.start_step <= header.step
            ):
                raise AlreadyHave()
        return expected

    def train(self, plan_version: int) -> SessionEnd:
        self.plan_version = plan_version
        if self.failed:
            log.warning("%s", self.failed)
            return SessionEnd.PEER_LOST
        if self.role is None or self.model is None:
            log.info("the plan leaves this peer out: waiting as a spare")
            return SessionEnd.SPARE
        role, model = self.role, self.model
        # frames a neighbour of an earlier plan sent (for steps this plan re-runs) are never ours
        self.transport.forget(role.plan_key, self.step)
        while self.step < self.spec.steps:
            if self.inbox.stopped:
                return SessionEnd.STOPPED
            if self.inbox.version != self.plan_version:
                if self._placement_changed():
                    return SessionEnd.NEW_PLAN
                self.plan_version = self.inbox.version  # same placement (new addresses): go on
            started_s, step_thread_cpu_s = time.monotonic(), time.thread_time()
            set_lr(self.optimizer, lr_at(self.step, self.spec))
            timing = pipeline.StageTiming()
            passes_s, passes_cpu = time.monotonic(), self._cpu.split()
            update_cpu_s = time.thread_time() - step_thread_cpu_s  # before the passes
            try:
                loss = pipeline.run_step(
                    model, self.spec, role, self.transport, self.corpus, self.step,
                    self._should_stop, self.plan.network, timing, self.precision,
                )  # fmt: skip
            except Stopped:
                self.optimizer.zero_grad(set_to_none=True)
                return SessionEnd.STOPPED
            except PeerLost as exc:
                log.warning("step %d: %s", self.step, exc)
                self.optimizer.zero_grad(set_to_none=True)
                return SessionEnd.PEER_LOST
            pipeline.unscale_grads(model, self.spec)
            averaging_s, round_start_cpu = time.monotonic(), self._cpu.split()
            computed_cpu_s = timing.forward_cpu_s + timing.backward_cpu_s
            frames_cpu_s = max(0.0, round_start_cpu.own - passes_cpu.own - computed_cpu_s)
            helpers_cpu_s = round_start_cpu.helpers - passes_cpu.helpers
            averaging = self._average_gradients()
            update_s, round_end_cpu_s = time.monotonic(), self._cpu.seconds()
            averaging_cpu_s = round_end_cpu_s - round_start_cpu.total
            before_wire_cpu_s, after_wire_cpu_s = round_cpu_split(
                round_start_cpu.total, round_end_cpu_s, self._wire_cpu
            )
            averaged_thread_cpu_s = time.thread_time()
            if averaging == "stopped" and self.inbox.stopped:
                self.optimizer.zero_grad(set_to_none=True)
                return SessionEnd.STOPPED
            if averaging in ("local", "stopped") and self._placement_changed():
                # the group broke and a new plan is already here: the swarm re-runs this step
                # under it (worker/resume.py), so a local-only update would only diverge
                log.info("step %d: averaging failed and a new plan arrived: step not applied",
                         self.step)  # fmt: skip
                self.optimizer.zero_grad(set_to_none=True)
                return SessionEnd.NEW_PLAN
            clip_grads(model, self.spec.grad_clip)
            # kept so that close() can also save the state one step back (worker/resume.py)
            self._previous = StageSnapshot.take(model, self.optimizer, self.step)
            if grads_are_finite(model):
                self.optimizer.step()
            else:  # the stage keeps its weights; a drift from its replicas is re-synced later
                log.warning("step %d: non-finite gradients: the update is skipped", self.step)
            self.optimizer.zero_grad(set_to_none=True)
            if self._resync_params:
                self._resync()
            now = time.monotonic()
            elapsed_s = now - started_s
            traffic = self.transport.traffic
            self.report(
                MetricsReport(
                    step=self.step,
                    loss=loss,
                    tokens_per_s=len(self.rows) * self.spec.block_size / elapsed_s,
                    stage=role.stage,
                    replica=role.replica,
                    samples=len(self.rows),
                    averaging=averaging,
                    step_s=elapsed_s,
                    epoch=role.epoch,
                    term=self.plan.term,
                    num_replicas=role.num_replicas,
                    bytes_sent=traffic.bytes_sent,
                    bytes_received=traffic.bytes_received,
                    link_bytes=traffic.link_bytes(),
                    group_size=self._group_size,
                    forward_s=timing.forward_s,
                    backward_s=timing.backward_s,
                    # the rest of the step outside the passes and averaging: clipping, the
                    # snapshot for resuming, the optimizer
                    update_s=(passes_s - started_s) + (now - update_s),
                    averaging_s=update_s - averaging_s,
                    averaging_cpu_s=averaging_cpu_s if self._cpu.available else None,
                    averaging_cpu_before_s=before_wire_cpu_s if self._cpu.available else None,
                    averaging_cpu_after_s=after_wire_cpu_s if self._cpu.available else None,
                    frames_cpu_s=frames_cpu_s if self._cpu.available else None,
                    helpers_cpu_s=helpers_cpu_s if self._cpu.available else None,
                    frames=timing.frames,
                    forward_cpu_s=timing.forward_cpu_s,
                    backward_cpu_s=timing.backward_cpu_s,
                    update_cpu_s=update_cpu_s + time.thread_time() - averaged_thread_cpu_s,
                    start_step=self.start_step,
                    start_lineage=self.start_lineage,
                    resume_never=self.started_from.startswith('resume = "never"'),
                )
            )
            self.step += 1
            self.transport.forget(role.plan_key, self.step)
            interval = self.spec.checkpoint_interval
            if interval and self.step % interval == 0 and self.step < self.spec.steps:
                self.save()
        return SessionEnd.DONE

    def _average_gradients(self) -> str:
        """Replace this stage's gradients by their verified average over replicas; the outcome."""
        assert self.model is not None
        self._group_size, self._wire_cpu = 1, None
        if self.averager is None:
            return "solo"
        params = [p for p in self.model.parameters() if p.grad is not None]
        # hivemind averages CPU tensors: one copy off the device each way
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]).cpu()
        assert self.role is not None
        if self.faults.before_averaging(self.step, self.role.stage, self.role.replica):
            return "local"
        flat_params = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).cpu()
        averaged, outcome = self.averager.average(flat, self.step, self._should_stop, flat_params)
        offset = 0
        for p in params:
            assert p.grad is not None
            p.grad.copy_(averaged[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        self._resync_params = outcome.diverged
        self._group_size, self._wire_cpu = outcome.group_size, outcome.wire_cpu
        return outcome.kind

    def _resync(self) -> None:
        """The group saw its replicas start a step from different parameters (a replica once
        applied a local-only update): all of them average their parameters and AdamW moments
        now, together, in the same order."""
        assert self.model is not None and self.averager is not None
        params = list(self.model.parameters())
        pieces: list[tuple[str, list[torch.Tensor]]] = [("params", list(params))]
        for name in ("exp_avg", "exp_avg_sq"):
            moments = [self.optimizer.state.get(p, {}).get(name) for p in params]
            if all(isinstance(m, torch.Tensor) for m in moments):
                pieces.append((name, [m for m in moments if m is not None]))
        for index, (name, tensors) in enumerate(pieces):
            flat = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu()
            bound = PARAMS_DRIFT_BOUND if index == 0 else MOMENTS_DRIFT_BOUND
            averaged = self.averager.average_state(flat, -(3 * self.step + index + 1), bound)
            if averaged is None or not bool(torch.isfinite(averaged).all()):
                log.warning("step %d: replicas diverged and re-syncing failed; retrying later",
                            self.step)  # fmt: skip
                return
            if name == "exp_avg_sq":
                # Adam's second moment is >= 0, but an fp16 wire rounds the tiny deltas it is
                # averaged with: a value can come back just below 0, and its square root NaN
                averaged.clamp_(min=0.0)
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(averaged[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
        log.info("step %d: replicas had diverged: parameters re-synced", self.step)

    def _should_stop(self) -> bool:
        return self.inbox.stopped or self._placement_changed()

    def _placement_changed(self) -> bool:
        """Does the newest plan place peers differently from ours? (Then this session ends.)"""
        latest = self.inbox.latest
        if self.inbox.version == self.plan_version or latest is None:
            return False
        return not latest.plan.same_placement(self.plan)

    def save(self) -> None:
        """The stage's state at the current step boundary, and the one before it if known."""
        if self.model is None or self.failed:
            return
        previous = self._previous
        # tagged with the plan's lineage; pruning keeps the newest of this lineage's and its
        # ancestors' states (train/checkpoint.py)
        tag, rank = self.plan.state_tag, self.plan.state_rank
        if previous is not None and previous.step == self.step - 1:
            record_step(self.directory, self.spec, self.model, previous, tag,
                        lambda t: rank(t) is not None)  # fmt: skip
        current = StageSnapshot(self.step, self.model.state_dict(), self.optimizer.state_dict())
        record_step(self.directory, self.spec, self.model, current, tag,
                    lambda t: rank(t) is not None)  # fmt: skip
        log.info("checkpoint: step %d -> %s", self.step, self.directory)

    def close(self) -> None:
        """Checkpoint (weights are always those of the last completed step) and leave the swarm."""
        self.save()
        if self.averager is not None:
            # hivemind's shutdown may wait for long on a dead groupmate: bound it (a leftover
            # averager process is killed with the worker's process group by the watchdog)
            done = threading.Thread(target=self.averager.shutdown, daemon=True)
            done.start()
            done.join(AVERAGER_SHUTDOWN_S)
            self.averager = None
        self.model = None
