"""The step's profiler hook (worker/profiler.py): a no-op without --profile, the CPU clocks and
a StepProfile with it; and the training step reads as one (issue 27)."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

from p2ptrain.records import Role, StepProfile
from p2ptrain.worker.pipeline.stage_step import StageTiming
from p2ptrain.worker.profiler import NO_PROFILE, CpuProfiler, StepProfiler

SESSION_SOURCE = Path(__file__).resolve().parents[2] / "p2ptrain" / "worker" / "session.py"
ROLE = Role(
    term=3,
    epoch=4,
    stage=1,
    num_stages=2,
    replica=0,
    num_replicas=2,
    prev_peer="a",
    next_peer=None,
    stage_peers=("b", "c"),
)


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _step(profiler: StepProfiler, wire: tuple[float, float] | None) -> StepProfile | None:
    timing = StageTiming(forward_cpu_s=0.01, backward_cpu_s=0.02, frames=6)
    profiler.step_started()
    _burn(0.02)  # the update's first part (the learning rate)
    profiler.passes_started()
    profiler.round_started(timing)
    _burn(0.05)  # the round, in this process
    profiler.round_ended(wire)
    _burn(0.03)  # clipping, the optimizer
    return profiler.step_ended(7, ROLE, timing)


def test_without_profile_the_hook_measures_nothing() -> None:
    assert _step(NO_PROFILE, (1.0, 2.0)) is None
    marks = NO_PROFILE.wire_marks()
    marks.start()
    marks.mark(100, 100)
    marks.finish()
    assert marks.root is None and marks.last() is None  # no clock read, no round reported


def test_the_cpu_profiler_profiles_the_step_from_its_clocks() -> None:
    profiler = CpuProfiler()
    profile = _step(profiler, None)
    assert isinstance(profile, StepProfile)
    assert (profile.step, profile.plan_key, profile.stage, profile.replica) == (7, (3, 4), 1, 0)
    assert (profile.forward_cpu_s, profile.backward_cpu_s, profile.frames) == (0.01, 0.02, 6)
    # the thread's CPU before the passes and after the round, not the round's own
    assert 0.04 <= profile.update_cpu_s < 0.09, profile
    # the tree's clock ticks in 10 ms: the round's 50 ms of CPU, roughly; no marks, no split
    assert profile.averaging_cpu_s is not None and 0.02 <= profile.averaging_cpu_s < 0.2
    assert profile.averaging_cpu_before_s is None and profile.averaging_cpu_after_s is None
    assert StepProfile.from_dict(profile.to_dict()) == profile
    assert profiler.wire_marks().root == os.getpid()


def test_the_training_step_fits_on_a_screen() -> None:
    # read as source, not imported: session.py imports hivemind, which cannot share a process
    # with the py-libp2p the control tests import
    module = ast.parse(SESSION_SOURCE.read_text(encoding="utf-8"))
    (session,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Session"]
    (train,) = [n for n in session.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    assert train.end_lineno is not None
    lines = train.end_lineno - train.lineno + 1 + len(train.decorator_list)
    assert lines <= 70, lines
    # and the profiling lives in the hook: no clock of its own in the session
    text = SESSION_SOURCE.read_text(encoding="utf-8")
    assert "thread_time" not in text and "cpu_clock" not in text
