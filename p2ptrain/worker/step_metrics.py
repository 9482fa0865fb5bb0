"""The operator's metrics of one training step (records/messages.py's MetricsReport): what the
step trained, its bytes and how long its pieces took, from wall-clock marks the session takes as
the step runs. Where the CPU went is the profiler's (worker/profiler.py), not these metrics'.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from p2ptrain.records import MetricsReport, Role

if TYPE_CHECKING:
    from p2ptrain.worker.pipeline.stage_step import StageTiming
    from p2ptrain.worker.traffic import Traffic


@dataclasses.dataclass
class StepTimes:
    """When a step started, its passes started, its averaging round started and its update's
    rest started (the round ended): time.monotonic() seconds."""

    started_s: float = dataclasses.field(default_factory=time.monotonic)
    passes_s: float = 0.0
    averaging_s: float = 0.0
    update_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class SessionFacts:
    """What every step of a session reports alike: its role and rows, where it started."""

    role: Role
    term: int
    samples: int  # the replica's rows of the global batch
    block_size: int
    start_step: int
    start_lineage: str  # the lineage of the state it resumed from (worker/resume/restore.py)
    resume_never: bool  # it started fresh because the run says resume = "never"

    def reported(self) -> dict[str, Any]:
        """These facts as a MetricsReport's fields (the same names)."""
        role = {name: getattr(self.role, name) for name in REPORTED_ROLE}
        return role | {name: getattr(self, name) for name in REPORTED_FACTS}


# what every report of a session says alike: of its role, and of the session
REPORTED_ROLE = ("stage", "replica", "epoch", "num_replicas")
REPORTED_FACTS = ("term", "samples", "start_step", "start_lineage", "resume_never")


def step_metrics(
    facts: SessionFacts,
    step: int,
    loss: float | None,
    averaging: str,
    group_size: int,
    traffic: Traffic,
    times: StepTimes,
    timing: StageTiming,
) -> MetricsReport:
    """The report of a step just trained: `group_size` replicas averaged its gradient (1: none),
    `traffic` counts the worker's bytes so far."""
    now = time.monotonic()
    elapsed_s = now - times.started_s
    return MetricsReport(
        step=step,
        loss=loss,
        tokens_per_s=facts.samples * facts.block_size / elapsed_s,
        averaging=averaging,
        step_s=elapsed_s,
        **facts.reported(),
        bytes_sent=traffic.bytes_sent,
        bytes_received=traffic.bytes_received,
        link_bytes=traffic.link_bytes(),
        group_size=group_size,
        forward_s=timing.forward_s,
        backward_s=timing.backward_s,
        # the rest of the step outside the passes and averaging: setting the learning rate,
        # clipping, the snapshot for resuming, the optimizer
        update_s=(times.passes_s - times.started_s) + (now - times.update_s),
        averaging_s=times.update_s - times.averaging_s,
    )
