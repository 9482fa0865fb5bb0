"""A worker's CPU profile of one training step: what a worker started with `join --profile`
appends to its metrics log after each step's MetricsReport (worker/profiler.py measures it).
The operator's metrics say how long a step took; the profile says where this machine's CPU went,
for the bench's step simulation (harness/e2e_compute.py, docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from p2ptrain.records.codec import Record

# CPU seconds of the worker's process tree (worker/cpu_clock.py): None where it cannot be read
TREE_FIELDS = (
    "frames_cpu_s",
    "helpers_cpu_s",
    "averaging_cpu_s",
    "averaging_cpu_before_s",
    "averaging_cpu_after_s",
)


@dataclass(frozen=True)
class StepProfile(Record, name="profile"):
    """Where one step of one worker spent CPU; (term, epoch, step) pairs it with its metrics."""

    TYPE: ClassVar[str] = "profile"
    step: int
    term: int
    epoch: int
    stage: int
    replica: int
    # the CPU seconds of the worker's own thread in the stage's passes and in the update (a
    # CPU-bound piece under a quota takes its CPU / the quota; its wall time also holds the
    # waits other threads' work caused)
    forward_cpu_s: float
    backward_cpu_s: float
    update_cpu_s: float
    frames: int  # the frames the stage sent and took in during the passes
    # during the passes: the CPU the worker's process and its p2pd daemon spent besides the
    # passes' own compute (serialising frames, the asyncio thread, the daemon's copies), and the
    # CPU hivemind's DHT and averager processes spent (their background, a round's tail)
    frames_cpu_s: float | None = None
    helpers_cpu_s: float | None = None
    # the process tree's CPU in the averaging round and, of it, what was spent before the
    # round's first part left and after its last part arrived (the rest ran while parts were on
    # the wire); the split is None when no part moved
    averaging_cpu_s: float | None = None
    averaging_cpu_before_s: float | None = None
    averaging_cpu_after_s: float | None = None

    @property
    def plan_key(self) -> tuple[int, int]:
        return self.term, self.epoch
