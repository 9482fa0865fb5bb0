"""The training step's profiler: one hook a session calls at the phases of each step, which owns
the CPU clocks and makes the step's StepProfile (records/profile.py).

A session's step runs: start -> passes -> averaging round -> update -> report. `StepProfiler` is
the hook and its no-op, what a worker without `--profile` holds: it reads no clock and makes no
profile. `CpuProfiler` (`join --profile`, set by the bench harness) reads the worker thread's
CPU clock around the update, the process tree's (worker/cpu_clock.py) around the passes and the
round, and has the averager mark the tree's clock as the round's parts come and go.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from p2ptrain.records import Role, StepProfile
from p2ptrain.worker.cpu_clock import TreeCpu, TreeCpuClock, WireMarks, round_cpu_split

if TYPE_CHECKING:
    from p2ptrain.worker.pipeline.stage_step import StageTiming


class StepProfiler:
    """The hook a session calls; this one does nothing (a worker without --profile)."""

    def wire_marks(self) -> WireMarks:
        """What the session's averager marks as its rounds' parts come and go."""
        return WireMarks(None)

    def step_started(self) -> None:
        """Before the learning rate is set: the update's first part starts."""

    def passes_started(self) -> None:
        """Before the stage's forward and backward passes."""

    def round_started(self, timing: StageTiming) -> None:
        """The passes are done (`timing`: their thread CPU); the averaging round starts."""

    def round_ended(self, wire: tuple[float, float] | None) -> None:
        """The round is done (`wire`: its marks, WireMarks.last()); the update's rest starts."""

    def step_ended(self, step: int, role: Role, timing: StageTiming) -> StepProfile | None:
        """The update is done: the step's profile, if this hook makes one."""
        return None


NO_PROFILE = StepProfiler()
# what a profile says of the role that trained the step, as the role says it
PROFILED_ROLE = ("term", "epoch", "stage", "replica")


class CpuProfiler(StepProfiler):
    """Where each step's CPU went (one per session: the tree's processes live as long as it)."""

    def __init__(self) -> None:
        self._tree = TreeCpuClock()
        self._step_thread_s = self._averaged_thread_s = self._update_cpu_s = 0.0
        self._passes = self._round_start = TreeCpu(0.0, 0.0)
        self._frames_cpu_s = self._helpers_cpu_s = self._averaging_cpu_s = 0.0
        self._wire_split: tuple[float | None, float | None] = (None, None)

    def wire_marks(self) -> WireMarks:
        return WireMarks(os.getpid())

    def step_started(self) -> None:
        self._step_thread_s = time.thread_time()

    def passes_started(self) -> None:
        self._passes = self._tree.split()
        self._update_cpu_s = time.thread_time() - self._step_thread_s  # before the passes

    def round_started(self, timing: StageTiming) -> None:
        self._round_start = start = self._tree.split()
        # the worker's and daemon's CPU in the passes besides their compute moved the frames
        computed_cpu_s = timing.forward_cpu_s + timing.backward_cpu_s
        self._frames_cpu_s = max(0.0, start.own - self._passes.own - computed_cpu_s)
        self._helpers_cpu_s = max(0.0, start.helpers - self._passes.helpers)

    def round_ended(self, wire: tuple[float, float] | None) -> None:
        end_s = self._tree.seconds()
        self._averaging_cpu_s = max(0.0, end_s - self._round_start.total)
        self._wire_split = round_cpu_split(self._round_start.total, end_s, wire)
        self._averaged_thread_s = time.thread_time()

    def step_ended(self, step: int, role: Role, timing: StageTiming) -> StepProfile:
        tree = self._tree.available
        before_s, after_s = self._wire_split if tree else (None, None)
        return StepProfile(
            step=step,
            **{name: getattr(role, name) for name in PROFILED_ROLE},
            forward_cpu_s=timing.forward_cpu_s,
            backward_cpu_s=timing.backward_cpu_s,
            update_cpu_s=self._update_cpu_s + time.thread_time() - self._averaged_thread_s,
            frames=timing.frames,
            frames_cpu_s=self._frames_cpu_s if tree else None,
            helpers_cpu_s=self._helpers_cpu_s if tree else None,
            averaging_cpu_s=self._averaging_cpu_s if tree else None,
            averaging_cpu_before_s=before_s,
            averaging_cpu_after_s=after_s,
        )
