"""DiLoCo's outer rounds for one replica of one stage (`sync = "diloco"`, train/outer.py).

Each pipeline is a replica: it trains its own batches with its own AdamW, and no gradient is
averaged per step. A stage's flat parameter vector is cut into F = outer_fragments equal slices
(train/outer.py's fragment_spans); fragment f of stage i of S meets its group after the steps s
with (s + 1) ≡ ⌊(f·S + i)·H/(S·F)⌋ (mod H), H = inner_steps (Streaming DiLoCo's staggering:
neither a pipeline's stages nor a stage's fragments send at once, so a replica's round traffic
and CPU are spread over H, not one burst), from the first period's end on (every slot's first
round covers at least H steps, so staggering adds no round), and all after the run's last step,
so every stage ends with its replicas in agreement. Each fragment has its own exchange, anchor
slice and error feedback; the outer momentum is per value.

A round: the fragment's pseudo-gradient (anchor − now) goes to its outer exchange (the plan's
group and weights, finite checks, centred clip, checksums: worker/averaging/outer_exchange.py)
in a background thread while the replica trains on. From `overlap_steps(H)` steps later (at
once after the run's last step) the replica applies the result: the outer Nesterov step
moves the anchor, and the parameters become the new anchor plus the inner progress made since
the round started (that progress is in the next round's pseudo-gradient, as the anchor moved).
The round carries the anchor's digest: every member checks that all started it from the same
anchor; if not (a replica missed a round), the group averages anchors and outer momenta.

A round that fails (a groupmate died, the group did not form in the plan's timeouts) applies
nothing: the anchor stays and the next round's pseudo-gradient covers the missed steps too, so a
dead replica costs only its own inner progress. A stage of one replica applies its own
pseudo-gradient at once (DiLoCo with one worker): its outer state stays that of the run, ready
for the replicas a later plan adds.

The exchange is ours (worker/averaging/outer_exchange.py): `outer_compression` is what the wire
carries (fp16 or block-wise int8 in a reduce-scatter, top-k at 2 bits with this replica's error
feedback in a sparse gather). The StageAverager (hivemind) serves only the anchors' re-sync, and
is opened the first time one is needed (worker/replica_rounds.py says why).

The round never holds a step up while it runs: its thread runs at a lower CPU priority than the
passes (ROUND_NICE), its sends and its own CPU are paced over the steps before its result is due
(round_pacing.py: the thread and the p2pd daemon that carries the bytes share the worker's CPU;
all at once, they stretched the next step 1.6-2x on a small quota), and a result not ready at
its step is applied at the first later step it is, waited for only when the stage's next round
is due (H steps on) or the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from p2ptrain.errors import WireError
from p2ptrain.records import MetricsReport, RunSpec
from p2ptrain.train import codecs
from p2ptrain.train.model import Stage
from p2ptrain.train.outer import OuterOptimizer, fragment_spans, fragments_due, overlap_steps
from p2ptrain.train.recut import OUTER_STEPS
from p2ptrain.worker.averaging.robust import MOMENTS_DRIFT_BOUND, PARAMS_DRIFT_BOUND
from p2ptrain.worker.averaging.round_pacing import ROUND_CPU_SHARE
from p2ptrain.worker.resume.resync import resync_pieces

if TYPE_CHECKING:
    from p2ptrain.worker.averaging.outer_exchange import OuterExchange
    from p2ptrain.worker.averaging.stage_averager import Outcome, StageAverager

log = logging.getLogger("p2ptrain.worker")

ROUND_NICE = 10  # the round's thread yields the CPU quota to the passes (Linux: per thread)
# a round's sends spread over this part of its overlap (the steps before its result is due;
# a result that comes later is applied at the first step it is ready, not waited for)
ROUND_SPREAD = 1.0


def due(spec: RunSpec, stage: int, num_stages: int, step: int) -> list[int]:
    """The fragments of stage `stage` that start an outer round after training `step`."""
    optim = spec.optim
    return fragments_due(
        step, optim.steps, optim.inner_steps, stage, num_stages, optim.outer_fragments
    )


@dataclasses.dataclass
class _Pending:
    """A round of fragment `fragment` (the [start, end) `span` of the stage's flat vector)
    started after step `step`, running in `thread`."""

    fragment: int
    span: tuple[int, int]
    step: int
    apply_at: int  # applied after training this step
    started_params: torch.Tensor  # the flat parameters when the round started
    thread: threading.Thread | None = None
    result: tuple[torch.Tensor, Outcome] | None = None
    skipped: bool = False  # a fault's: the group's mean is not applied here

    def ready(self) -> bool:
        return self.thread is None or not self.thread.is_alive()


@dataclasses.dataclass(frozen=True)
class RoundReport:
    """What the step's outer round did: 'averaged' over group_size replicas, 'solo' (a
    one-replica stage), 'local' (failed: nothing applied) or 'stopped'; and whether it was
    started ('started') or applied now."""

    kind: str
    group_size: int = 1


class OuterRounds:
    def __init__(
        self,
        spec: RunSpec,
        stage: int,
        num_stages: int,
        model: Stage,
        open_averager: Callable[[], StageAverager | None] | None,
        overlap: int | None = None,
        exchanges: list[OuterExchange] | None = None,
        skips_round: Callable[[int], bool] | None = None,
    ) -> None:
        """exchanges: the group's outer rounds, one a fragment (None: a one-replica stage);
        open_averager: opens the anchors' re-sync (hivemind), the first time the group's
        anchors differ; skips_round: fault injection (worker/faults.py's skip-averaging), True
        for a step whose round this replica joins but whose mean it then does not apply (its
        anchor leaves the group's, as a missed round's would)."""
        self.spec, self.stage, self.num_stages = spec, stage, num_stages
        self._skips_round = skips_round
        self._open_averager = open_averager
        self.averager: StageAverager | None = None
        self.exchanges = exchanges
        self.outer = OuterOptimizer(model, spec.optim.outer_lr, spec.optim.outer_momentum)
        self.spans = fragment_spans(self.outer.numel, spec.optim.outer_fragments)
        self.overlap = overlap_steps(spec.optim.inner_steps) if overlap is None else overlap
        # a one-replica stage's rounds keep a group's numerics: error feedback per fragment
        self.topk = [
            codecs.TopKCompressor(end - start, spec.wire.topk_fraction)
            for start, end in self.spans
            if spec.wire.outer_compression == "topk"
        ]
        # a round's start copies the parameters and their pseudo-gradient into these, held by
        # the round until it is applied, whichever round: touched now, before step 0, the
        # pages are not faulted in by the training thread at every round's start
        self._started = torch.zeros_like(self.outer.anchor)
        self._delta = torch.zeros_like(self.outer.anchor)
        self._pending: dict[int, _Pending] = {}  # by fragment
        self._step_s = 0.0  # the last inner step's wall time (paces a round's sends)
        self._step_cpu_s = 0.0  # and the CPU the passes' thread used in it
        self._stepped_at: tuple[float, float] | None = None  # (wall, thread CPU) clocks

    @property
    def outer_steps(self) -> int:
        return self.outer.outer_steps

    # --- the round ---

    def after_step(self, step: int, should_stop: Callable[[], bool]) -> RoundReport | None:
        """After the inner update of `step`: apply a round that is due, start one that is due;
        what happened (None: no round touched this step)."""
        report = None
        now = (time.monotonic(), time.thread_time())  # called from the passes' thread
        if self._stepped_at is not None:
            self._step_s = now[0] - self._stepped_at[0]
            self._step_cpu_s = now[1] - self._stepped_at[1]
        self._stepped_at = now
        last = step + 1 == self.spec.optim.steps
        # a result not ready at its step: train on, apply it at the first step it is (the
        # fragment's next round's start below waits for it at the latest)
        for pending in list(self._pending.values()):
            if last or (pending.apply_at <= step and pending.ready()):
                report = self._finish(pending, step)
        for fragment in due(self.spec, self.stage, self.num_stages, step):
            if fragment in self._pending:  # its round still running: finish it first
                report = self._finish(self._pending[fragment], step)
            report = self._start(fragment, step, should_stop, at_once=last) or report
        return report

    def _start(
        self, fragment: int, step: int, should_stop: Callable[[], bool], at_once: bool
    ) -> RoundReport | None:
        span = start, end = self.spans[fragment]
        if self.exchanges is None:  # one replica: its own pseudo-gradient is the mean
            own = self.outer.pseudo_gradient(span=span)
            self.outer.step(self._encoded(own, fragment), span)
            log.info(
                "step %d: outer step %d applied (round of step %d, %s, 1 replica)",
                step,
                self.outer.outer_steps,
                step,
                self._fragment_name(fragment),
            )
            return RoundReport("solo")
        exchange = self.exchanges[fragment]
        # the exchange works on CPU tensors; the anchor's digest shows the group started alike
        # the fragment's previous round was applied (or waited for) before this one starts
        started = self.outer.flat_params(out=self._started[start:end], span=span)
        delta = self.outer.pseudo_gradient(started, out=self._delta[start:end], span=span).cpu()
        anchor = self.outer.anchor[start:end].cpu()
        apply_at = step + (0 if at_once else self.overlap)
        pending = _Pending(fragment, span, step, apply_at, started)
        pending.skipped = self._skips_round is not None and self._skips_round(step)
        spread_s = ROUND_SPREAD * (apply_at - step) * self._step_s
        passes_rate = self._step_cpu_s / self._step_s if self._step_s > 0 else 0.0
        cpu_rate = ROUND_CPU_SHARE * passes_rate

        def run() -> None:
            with contextlib.suppress(OSError, AttributeError):  # not Linux: normal priority
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ROUND_NICE)
            pending.result = exchange.run(delta, step, should_stop, anchor, spread_s, cpu_rate)

        name = f"outer-round-{step}-{fragment}"
        pending.thread = threading.Thread(target=run, name=name, daemon=True)
        pending.thread.start()
        self._pending[fragment] = pending
        if pending.apply_at == step:
            return self._finish(pending, step)
        return RoundReport("started")

    def _encoded(self, delta: torch.Tensor, fragment: int) -> torch.Tensor:
        """What the codec would deliver of `delta` (a one-replica stage keeps the numerics of
        a group's rounds)."""
        if self.spec.wire.outer_compression == "int8":
            return codecs.decode_int8_blocks(codecs.encode_int8_blocks(delta), delta.shape)
        if self.topk:  # its residual on the CPU, as a group's exchange keeps it
            return self.topk[fragment].encode(delta.cpu())[1].to(delta.device)
        return delta

    def _exchange(self, pending: _Pending) -> OuterExchange:
        assert self.exchanges is not None  # a round of a group's
        return self.exchanges[pending.fragment]

    def _fragment_name(self, fragment: int) -> str:
        return f"fragment {fragment + 1}/{len(self.spans)}"

    def _finish(self, pending: _Pending, step: int) -> RoundReport:
        """Wait for the round (its own timeouts bound it) and apply what it gave."""
        if pending.thread is not None:
            pending.thread.join()
        self._pending.pop(pending.fragment, None)
        if pending.result is None:  # the thread raised: logged by threading
            self._exchange(pending).undo_feedback()
            return RoundReport("local")
        mean, outcome = pending.result
        if pending.skipped and outcome.kind == "averaged":
            log.warning("step %d: fault: outer round of step %d skipped", step, pending.step)
            self._exchange(pending).undo_feedback()
            return RoundReport("local")
        if outcome.kind != "averaged":
            log.warning(
                "step %d: outer round of step %d (%s) %s: not applied (%s)",
                step,
                pending.step,
                self._fragment_name(pending.fragment),
                outcome.kind,
                outcome.detail,
            )
            return RoundReport(outcome.kind)
        self._exchange(pending).keep_feedback()
        # in place: no more stage-sized buffers on the training thread than needed
        span = start, end = pending.span
        progress = self.outer.flat_params(span=span).sub_(pending.started_params)  # 0: at once
        self.outer.step(mean.to(self.outer.anchor.device), span)
        if outcome.diverged:
            self._resync(step, pending.step)
        self.outer.load_params(progress.add_(self.outer.anchor[start:end]), span)
        log.info(
            "step %d: outer step %d applied (round of step %d, %s, %d replicas)",
            step,
            self.outer.outer_steps,
            pending.step,
            self._fragment_name(pending.fragment),
            outcome.group_size,
        )
        return RoundReport("averaged", outcome.group_size)

    def _resync(self, step: int, round_step: int) -> None:
        """The group's anchors differed at the round's start: average anchors and momenta
        (every member saw the same digests, so all open their averagers now). The state rounds
        are numbered by the round's step, the same on every member: the step it is applied at
        is not (a member whose result came late applies it a step later)."""
        if self.averager is None and self._open_averager is not None:
            self.averager = self._open_averager()
        if self.averager is None:
            return
        pieces = [
            ("anchor", [self.outer.anchor], PARAMS_DRIFT_BOUND),
            ("momentum", [self.outer.momentum_buffer], MOMENTS_DRIFT_BOUND),
        ]
        if resync_pieces(self.averager, pieces, step, round_step):
            log.info("step %d: the replicas' anchors had diverged: re-synced", step)

    def close(self) -> None:
        """The session ends: a round still running is left to its own stop and timeouts."""
        pendings, self._pending = self._pending, {}
        for pending in pendings.values():
            if pending.thread is not None:
                pending.thread.join()
        if self.averager is not None:
            self.averager.close()
            self.averager = None

    # --- state: the anchor, outer momentum and count travel with the stage's state ---

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The outer state as a state file's tensors (train/state_file.py)."""
        return {
            **self.outer.state_tensors(),
            OUTER_STEPS: torch.tensor(self.outer.outer_steps, dtype=torch.int64),
        }

    def take_saved(self, saved: dict[str, torch.Tensor]) -> None:
        """A resumed or fetched state's anchor and outer momentum, if it has them (else the
        anchor is the resumed parameters, as after an outer step); the parameters are kept."""
        if not saved:
            return
        steps = saved.get(OUTER_STEPS)
        count = int(steps.item()) if isinstance(steps, torch.Tensor) and steps.numel() == 1 else -1
        try:
            self.outer.load_state_tensors(saved, {"outer_steps": count}, keep_params=True)
        except WireError as exc:
            log.warning("the saved outer state is not usable (%s): anchor = parameters", exc)
            return
        log.info("outer state carried: %d outer steps, the anchor and outer momentum", count)

    def reported(self, metrics: MetricsReport, done: RoundReport | None) -> MetricsReport:
        """The step's metrics with the outer rounds in them (the progress line shows them)."""
        return dataclasses.replace(
            metrics,
            outer_steps=self.outer.outer_steps,
            inner_steps=self.spec.optim.inner_steps,
            outer_round="" if done is None else done.kind,
            group_size=metrics.group_size if done is None else done.group_size,
        )
