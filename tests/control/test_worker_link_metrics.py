"""Our status line's metrics (control/worker_link.py): the worker's last report, as reported,
with the control plane's own counters."""

from __future__ import annotations

from typing import Any, cast

from p2ptrain.control.state import NodeState
from p2ptrain.control.worker_link import AS_REPORTED, WorkerLink
from p2ptrain.records import MetricsReport, PeerMetrics
from tests.control.test_view import ME, A, B, make_view
from tests.records.samples import metrics_dict


def test_our_metrics_are_the_workers_report_as_it_stands() -> None:
    view, _ = make_view(peers=(A, B))
    state = NodeState(bytes(range(1, 33)), "control-only", ME, cast(Any, None), view, {})
    link = WorkerLink(state, "/nonexistent/ipc.sock", print_progress=False)
    report = MetricsReport.from_dict(metrics_dict())
    link._on_message(report)
    link._on_message(report)
    metrics = view.own_metrics
    assert isinstance(metrics, PeerMetrics)
    assert {name: getattr(metrics, name) for name in AS_REPORTED} == {
        name: getattr(report, name) for name in AS_REPORTED
    }
    assert metrics.averaging == {"averaged": 2}  # the outcomes so far
    assert (metrics.step, metrics.start_lineage) == (3, "0123456789abcdef")


def test_members_our_start_agreement_never_heard_go_out_with_our_metrics() -> None:
    """The planner judges them (control/planning/silent_start.py); our next step's report,
    under a plan that started, names none."""
    from p2ptrain.records import StartReport

    view, _ = make_view(peers=(A, B))
    state = NodeState(bytes(range(1, 33)), "control-only", ME, cast(Any, None), view, {})
    link = WorkerLink(state, "/nonexistent/ipc.sock", print_progress=False)
    link._on_message(StartReport(3, 7, (A,)))
    metrics = view.own_metrics
    assert metrics is not None and (metrics.silent, metrics.silent_plan) == ((A,), (3, 7))
    assert PeerMetrics.from_dict(metrics.to_dict()) == metrics  # as it is gossiped
    link._on_message(MetricsReport.from_dict(metrics_dict()))
    assert view.own_metrics is not None and view.own_metrics.silent == ()
