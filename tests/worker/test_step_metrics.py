"""A step's metrics (worker/step_metrics.py): the session's facts and role reach the report under
their own names, with the step's bytes and times."""

from __future__ import annotations

import time

from p2ptrain.records import MetricsReport
from p2ptrain.worker.pipeline.stage_step import StageTiming
from p2ptrain.worker.step_metrics import SessionFacts, StepTimes, step_metrics
from p2ptrain.worker.traffic import Traffic
from tests.worker.test_profiler import ROLE  # a stage-1 member of two replicas


def test_a_report_carries_the_sessions_facts_and_the_steps_counts() -> None:
    facts = SessionFacts(ROLE, 3, 8, 16, 5, "root", False)
    traffic = Traffic()
    traffic.sent("b", 100)
    traffic.received("b", 40)
    start = time.monotonic() - 1.0
    times = StepTimes(started_s=start, passes_s=start + 0.1, averaging_s=start + 0.5)
    times.update_s = start + 0.7
    report = step_metrics(facts, 9, 2.5, "averaged", 2, traffic, times, StageTiming(0.2, 0.3))
    assert isinstance(report, MetricsReport)
    assert (report.step, report.loss, report.averaging, report.group_size) == (
        9,
        2.5,
        "averaged",
        2,
    )
    assert (report.stage, report.replica, report.epoch, report.num_replicas) == (1, 0, 4, 2)
    assert (report.term, report.samples, report.start_step) == (3, 8, 5)
    assert (report.start_lineage, report.resume_never) == ("root", False)
    assert (report.bytes_sent, report.bytes_received) == (100, 40)
    assert (report.forward_s, report.backward_s) == (0.2, 0.3)
    assert report.step_s >= 1.0 and report.tokens_per_s == 8 * 16 / report.step_s
    assert report.averaging_s is not None and abs(report.averaging_s - 0.2) < 1e-9
    assert report.update_s is not None and report.update_s >= 0.4
    assert MetricsReport.from_dict(report.to_dict()) == report  # a valid record on the wire
