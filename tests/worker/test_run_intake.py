"""A run spec that reaches the worker ahead of any plan (worker/run_intake.py): its saved states
are told as soon as our hello is out (the planner's first plan waits for every trainer's word on
them), its model is timed only once the whole start is done (a probe beside torch's warm-up
would time us slow), each once per run; a run that comes only with a plan (a harness's: no
planner reads the timing) is not timed, nor one whose planner does not price compute."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from p2ptrain.records import ComputeReport, RunSpec, SavedReport
from p2ptrain.worker.ipc import PlanInbox
from p2ptrain.worker.run_intake import RunIntake
from p2ptrain.worker.settings import WorkerSettings

SPEC = RunSpec().replace(run_id="intake", n_layer=2, n_head=2, n_embd=16, block_size=8)


class Sent:
    """What the intake sends the control process, each message as it comes."""

    def __init__(self) -> None:
        self.messages: list[object] = []
        self.arrived = threading.Condition()

    def send(self, message: object) -> None:
        with self.arrived:
            self.messages.append(message)
            self.arrived.notify_all()

    def wait_for(self, count: int) -> list[object]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.messages) >= count, timeout=60)
            return list(self.messages)


def _intake(tmp_path: Path) -> tuple[RunIntake, Sent]:
    """A worker's intake whose messages to the control process are kept in `Sent`."""
    intake = RunIntake(
        WorkerSettings(ipc="s", checkpoint_dir=str(tmp_path)), torch.device("cpu"), PlanInbox()
    )
    sent = Sent()
    intake.ipc = sent  # type: ignore[assignment]
    return intake, sent


def test_saved_states_are_told_at_hello_and_the_model_timed_once_the_worker_is_up(
    tmp_path: Path,
) -> None:
    intake, sent = _intake(tmp_path)
    intake.on_run(SPEC)
    intake.hello_sent()
    (saved,) = sent.wait_for(1)
    assert isinstance(saved, SavedReport) and saved.run_id == "intake"
    assert saved.saved == ()  # nothing saved in this node's directory
    intake.worker_is_up()
    _, timed = sent.wait_for(2)
    assert isinstance(timed, ComputeReport) and timed.compute.run_id == "intake"
    intake.time_compute(SPEC)  # a plan bringing the same run: neither is sent again
    assert len(sent.messages) == 2


def test_a_run_that_comes_only_with_a_plan_is_not_timed(tmp_path: Path) -> None:
    intake, sent = _intake(tmp_path)
    intake.worker_is_up()
    intake.time_compute(SPEC)  # the direct swarm's plan: its spec, nothing ahead
    assert sent.messages == []
    intake.on_run(SPEC.replace(run_id="ahead"))  # a control process's run, ahead of its plan
    intake.time_compute(SPEC.replace(run_id="ahead"))  # its plan: timed, now or on the thread
    kinds = {type(message) for message in sent.wait_for(2)}
    assert kinds == {SavedReport, ComputeReport}


def test_a_run_its_planner_does_not_price_on_compute_is_not_timed(tmp_path: Path) -> None:
    for blind in (SPEC.replace(compute_aware=False), SPEC.replace(placement="random")):
        intake, sent = _intake(tmp_path)
        intake.on_run(blind)
        intake.hello_sent()
        intake.worker_is_up()
        (saved,) = sent.wait_for(1)
        assert isinstance(saved, SavedReport)  # the saved states are still told
        intake.time_compute(blind)  # its plan
        for thread in threading.enumerate():  # the intake's own thread has done its part
            if thread.name == "compute-probe":
                thread.join(30)
        assert len(sent.messages) == 1, sent.messages  # and no timing
