"""Data-parallel gradient averaging for one stage, with every round verified (worker/averaging/checks.py).

A failed or partial round is retried once with whoever is still there; if that fails too, the
peer keeps its own (local) gradient: never a silently half-averaged one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from p2ptrain.errors import WireError
from p2ptrain.records import NetworkFacts
from p2ptrain.schedule.step_time import part_size_bytes
from p2ptrain.worker.averaging.checks import (
    COMPRESSED_TOLERANCE,
    EXACT_TOLERANCE,
    GRAD,
    STATE,
    RoundGather,
    check_round,
    checksums,
    fixed_signs,
    params_digest,
    replicas_diverged,
    settled_by_claims,
)
from p2ptrain.worker.averaging.round_timeouts import RETRY_TIMEOUT_S, averaging_timeouts

if TYPE_CHECKING:
    from hivemind import DHT

    from p2ptrain.worker.cpu_clock import WireMarks
    from p2ptrain.worker.traffic import Traffic

log = logging.getLogger(__name__)

STOP_POLL_S = 0.2  # how often a waiting round checks whether the session must end
SHUTDOWN_S = 3.0  # how long a session's end waits for hivemind's averager to shut down
DRAIN_POLL_S = 0.02  # how often a leaving averager looks whether its replies are out


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a step's gradient was combined: 'averaged' over group_size peers, or 'local'."""

    kind: str
    group_size: int
    detail: str = ""
    diverged: bool = False  # the group's replicas started the step from different parameters
    # the process tree's CPU clock when the round's first part left and its last part arrived
    # (worker/cpu_clock.py's WireMarks), None if it moved none
    wire_cpu: tuple[float, float] | None = None


class StageAverager:
    """Averages one stage's flat gradient with the other replicas of that stage."""

    def __init__(
        self,
        dht: DHT,
        num_params: int,
        prefix: str,
        num_replicas: int,
        compression: str,
        timeout_s: float,
        group: Mapping[str, float],
        network: NetworkFacts | None = None,
        stage: int | None = None,
        traffic: Traffic | None = None,
        wire: WireMarks | None = None,
        token_rows: Sequence[tuple[int, int]] = (),
    ) -> None:
        """network: what the plan says of its links, to scale the timeouts for (those of
        `stage`'s group when given).
        group: the stage's replicas as the plan lists them (this peer among them), each with
        its planned weight (its rows of the batch): a round's first attempt runs in that group
        (worker/averaging/planned_group.py), a retry in one of its members found by hivemind's DHT
        matchmaking. Every reducer uses these weights, never the ones senders claim.
        traffic: the worker's byte counters, which every round's bytes are added to.
        wire: marks the process tree's CPU clock as a round's parts come and go (a profiling
        worker's, worker/profiler.py); None: no marks.
        token_rows: the spans of the flat tensor that are rows of the token embedding or the
        head (train/model.py: token_row_spans), which the reducers bound apart."""
        self.traffic = traffic
        if len(group) < 2:
            raise ValueError(f"averaging needs a group of >= 2 replicas, got {dict(group)}")
        self.weights = dict(group)
        self._buffer = torch.zeros(num_params)
        self.timeouts = averaging_timeouts(
            num_params * (4 if compression == "none" else 2), network, stage
        )
        self._rounds = 0
        self.timeout_s = timeout_s
        self.tolerance = EXACT_TOLERANCE if compression == "none" else COMPRESSED_TOLERANCE
        # after full rounds replicas differ only by rounding (each adds the averaged delta to its
        # own tensor; with fp16 the delta is rounded too); one local-only update moves them
        # apart by ~1e-2 of the parameter norm
        self.divergence_tolerance = 1e-6 if compression == "none" else 1e-2
        self._param_signs = fixed_signs(num_params)
        # bf16 activations still average in fp16: hivemind has no bf16 codec, fp16 is closer anyway
        # hivemind only here: the timeout rules above stay importable beside libp2p (tests)
        from hivemind.compression import CompressionBase, Float16Compression, NoCompression

        from p2ptrain.worker.averaging.planned_gather import GroupmatesAhead
        from p2ptrain.worker.averaging.planned_group import PlannedGroupAverager

        codec: CompressionBase = NoCompression() if compression == "none" else Float16Compression()
        wire_bytes = 4 if compression == "none" else 2
        self._groupmates_ahead = GroupmatesAhead
        self._averager = PlannedGroupAverager(
            [self._buffer],
            dht,
            start=True,
            prefix=prefix,
            group=list(self.weights),
            weights=list(self.weights.values()),
            target_group_size=num_replicas,
            min_group_size=2,
            min_matchmaking_time=self.timeouts.min_matchmaking_s,
            request_timeout=self.timeouts.request_s,
            compression=codec,
            sender_timeout=self.timeouts.sender_s,
            reducer_timeout=self.timeouts.reducer_s,
            allreduce_timeout=self.timeouts.allreduce_s,
            # an even share for each member, in parts (schedule/step_time.py's part_size_bytes)
            part_size_bytes=part_size_bytes(num_params * wire_bytes, num_replicas, wire_bytes),
            wire=wire,
            token_rows=token_rows,
        )

    def average(
        self,
        flat_grad: torch.Tensor,
        step: int,
        should_stop: Callable[[], bool] | None = None,
        flat_params: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Outcome]:
        """The verified average of `flat_grad` over the group, weighted as the plan says, or
        flat_grad itself ('local'; 'stopped' if `should_stop()` turned true while waiting: a
        new plan is here)."""
        return self._round(flat_grad, step, should_stop, flat_params, None)

    def _round(
        self,
        flat: torch.Tensor,
        step: int,
        should_stop: Callable[[], bool] | None,
        flat_params: torch.Tensor | None,
        drift_bound: float | None,
    ) -> tuple[torch.Tensor, Outcome]:
        """A gradient round, or (with a drift_bound) a state round: see average_state."""
        kind = GRAD if drift_bound is None else STATE
        weights = self.weights if kind == GRAD else dict.fromkeys(self.weights, 1.0)
        mine = checksums(flat, step, weights[str(self._averager.peer_id)])
        if flat_params is not None:
            digest, norm = params_digest(flat_params, self._param_signs)
            mine = dataclasses.replace(mine, params=digest, params_norm=norm)
        # the drift bound is read by our own reducer only (worker/averaging/robust.py)
        gather = RoundGather(kind, mine, drift_bound)
        try:
            result, outcome = self._average(flat, gather, weights, should_stop)
        finally:
            if self.traffic is not None:
                self.traffic.add(self._averager.reports.traffic())
        return result, dataclasses.replace(outcome, wire_cpu=self._averager.wire.last())

    def _average(
        self,
        flat_grad: torch.Tensor,
        gather: RoundGather,
        weights: Mapping[str, float],
        should_stop: Callable[[], bool] | None,
    ) -> tuple[torch.Tensor, Outcome]:
        """The round's attempts (the first in the planned group, a retry through hivemind's
        matchmaking), each checked against what the members gathered."""
        mine, kind, step = gather.checksums, gather.kind, gather.checksums.step
        problem = ""
        failed: list[str] = []
        timeout_s = self.timeout_s
        for attempt in range(2):
            with self._averager.get_tensors() as (buffer,):
                buffer.copy_(flat_grad)
            try:
                control = self._averager.step(
                    gather=gather.to_dict(),
                    weight=mine.weight,
                    timeout=timeout_s,
                    wait=False,
                    allow_retries=attempt > 0,  # a planned round's retry is our attempt 2
                )
                gathered = _wait_unless_stopped(control, should_stop)
            except _Stopped:
                return flat_grad, Outcome("stopped", 1, "stopped while averaging")
            except Exception as exc:  # hivemind raises a few kinds on a broken round
                if isinstance(exc, self._groupmates_ahead):
                    # as below: the one behind gives the step up at once
                    log.warning("step %d: %s: local gradient", step, exc)
                    return flat_grad, Outcome("local", 1, str(exc))
                gathered, problem = None, f"averaging raised {exc!r}"
            timeout_s = min(self.timeout_s, RETRY_TIMEOUT_S)
            if gathered is None:
                problem = problem or "no group formed"
            else:
                with self._averager.get_tensors() as (buffer,):
                    result = buffer.clone()
                problem = check_round(result, mine, gathered, self.tolerance, weights, kind) or ""
                notes = self._averager.reports.notes()
                if not problem:
                    self._rounds += 1
                    diverged = replicas_diverged(gathered, self.divergence_tolerance)
                    detail = "; ".join([*failed, *notes])  # why a first attempt failed
                    return result, Outcome("averaged", len(gathered), detail, diverged)
                if notes:  # why the round failed on every member, if our reducer knows
                    problem = f"{problem} ({'; '.join(notes)})"
                # Replicas a step apart met (one kept a local gradient earlier and ran ahead).
                # The one behind gives this step up at once and so reaches the next round soon;
                # the one ahead waits for it with the full timeout: they are in step again.
                steps = _gathered_steps(gathered, kind)
                if steps and max(steps) > step:
                    log.warning("step %d: groupmates are ahead (%s): local gradient", step, problem)
                    return flat_grad, Outcome("local", 1, problem)
                if steps and min(steps) < step:
                    timeout_s = self.timeout_s
                elif settled_by_claims(mine, gathered, weights, kind):
                    problem += " (every member's claims: not retried)"
                    log.warning("step %d averaging failed: %s", step, problem)
                    return flat_grad, Outcome("local", 1, "; ".join([*failed, problem]))
            failed.append(f"attempt {attempt + 1}: {problem}")
            log.warning("step %d averaging attempt %d failed: %s", step, attempt + 1, problem)
        return flat_grad, Outcome("local", 1, "; ".join(failed))

    def average_state(
        self, flat: torch.Tensor, round_number: int, drift_bound: float
    ) -> torch.Tensor | None:
        """One verified round of plain averaging (equal weights) of a parameter-sized tensor
        (parameters, optimizer moments), to bring diverged replicas back together: a round of
        kind STATE (the checks refuse a group that mixes it with a gradient round), numbered
        alike on every member. A groupmate's part farther from ours than drift_bound × our
        part's norm is refused (worker/averaging/robust.py): a false parameter digest cannot
        force crafted parameters in. None if it failed."""
        averaged, outcome = self._round(flat, round_number, None, None, drift_bound)
        return averaged if outcome.kind == "averaged" else None

    def shutdown(self) -> None:
        """Leave the swarm once our reducer's replies are out, and after a last round linger_s
        more, for those bytes to arrive. Our own round can be done while a groupmate still waits
        for the averages of our share (a loaded machine, at a run's last step): leaving then
        broke its round, and the stage's replicas ended the run apart. A groupmate that never
        reads holds us at most reducer_s, the longest it may wait for a part anyway."""
        deadline = time.monotonic() + self.timeouts.reducer_s
        # a killed averager (a node's whole process group is stopped at once) serves nothing,
        # and its count stays where it was
        while (
            self._averager.is_alive()
            and self._averager.reports.replies_in_flight() > 0
            and time.monotonic() < deadline
        ):
            time.sleep(DRAIN_POLL_S)
        if self._rounds:
            time.sleep(self.timeouts.linger_s)
        self._averager.shutdown()

    def close(self) -> None:
        """shutdown(), waited for at most its replies' bound and SHUTDOWN_S more: hivemind's
        may wait for long on a dead groupmate (a leftover averager process is killed with the
        worker's process group by the watchdog)."""
        done = threading.Thread(target=self.shutdown, daemon=True)
        done.start()
        done.join(self.timeouts.reducer_s + self.timeouts.linger_s + SHUTDOWN_S)


class _Stopped(Exception):
    pass


def _wait_unless_stopped(control: Any, should_stop: Callable[[], bool] | None) -> Any:
    """The round's result; cancels it and raises _Stopped once `should_stop()` is true."""
    while True:
        try:
            return control.result(timeout=STOP_POLL_S)
        except TimeoutError:
            if should_stop is not None and should_stop():
                control.cancel()
                raise _Stopped() from None


def _gathered_steps(gathered: dict[Any, Any], kind: str) -> list[int]:
    """The steps of the groupmates whose metadata is valid, in rounds of `kind`."""
    steps = []
    for data in gathered.values():
        with contextlib.suppress(WireError):
            gather = RoundGather.from_dict(data)
            if gather.kind == kind:
                steps.append(gather.checksums.step)
    return steps
