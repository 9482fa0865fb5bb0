"""What a stage does with an incoming frame (worker/pipeline/stage_step.py's accepted_frame):
takes it, refuses it as not ours, asks the sender to come back (a step ahead), or tells it the
frame already arrived (a retried copy of an earlier step of this session)."""

from __future__ import annotations

import pytest

from p2ptrain.records import RunSpec
from p2ptrain.records.plan import Role
from p2ptrain.worker.pipeline.frames import (
    ACTIVATION,
    GRADIENT,
    AlreadyHave,
    Expected,
    FrameHeader,
    NotReady,
)
from p2ptrain.worker.pipeline.stage_step import accepted_frame

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=50)
MIDDLE = Role(3, 1, 1, 3, 0, 1, "prev", "next", ("me",))  # stage 1 of 3, plan (3, 1)
STEP, START = 10, 4


def header(kind: str, step: int, sender: str, micro: int = 0, epoch: int = 1) -> FrameHeader:
    return FrameHeader(kind, SPEC.run_id, 3, epoch, step, micro, sender, "fp32", (1,), 4)


def accepted(frame: FrameHeader, role: Role = MIDDLE) -> Expected | None:
    return accepted_frame(SPEC, role, STEP, START, frame)


def test_the_neighbours_frames_of_the_current_step_are_taken() -> None:
    activation = accepted(header(ACTIVATION, STEP, "prev"))
    gradient = accepted(header(GRADIENT, STEP, "next"))
    assert activation is not None and activation.sender == "prev"
    assert gradient is not None and gradient.sender == "next"


def test_the_previous_stage_may_run_one_step_ahead_but_not_two() -> None:
    assert accepted(header(ACTIVATION, STEP + 1, "prev")) is not None
    assert accepted(header(GRADIENT, STEP + 1, "next")) is None  # gradients never run ahead
    with pytest.raises(NotReady):
        accepted(header(ACTIVATION, STEP + 2, "prev"))


def test_frames_of_no_neighbour_or_kind_are_not_ours() -> None:
    first = Role(3, 1, 0, 3, 0, 1, None, "next", ("me",))
    assert accepted(header(ACTIVATION, STEP, "prev"), first) is None  # stage 0 reads the data
    # what is expected names its sender: the transport refuses the frame of anyone else
    from_prev = accepted(header(GRADIENT, STEP, "prev"))
    assert from_prev is not None and from_prev.sender == "next"
    assert accepted(header(ACTIVATION, STEP, "prev", micro=10_000)) is None


def test_a_retried_copy_of_an_earlier_step_of_this_session_already_arrived() -> None:
    with pytest.raises(AlreadyHave):
        accepted(header(ACTIVATION, STEP - 1, "prev"))
    with pytest.raises(AlreadyHave):
        accepted(header(GRADIENT, START, "next"))
    # not a copy: another sender, a step before this session, another plan
    assert accepted(header(ACTIVATION, STEP - 1, "stranger")) is None
    assert accepted(header(ACTIVATION, START - 1, "prev")) is None
    assert accepted(header(ACTIVATION, STEP - 1, "prev", epoch=2)) is None
