"""Our status line's metrics (control/worker_link.py): the worker's last report, as reported,
with the control plane's own counters."""

from __future__ import annotations

from typing import Any, cast

from p2ptrain.control.state import NodeState
from p2ptrain.control.worker_link import AS_REPORTED, WorkerLink
from p2ptrain.records import MetricsReport, PeerMetrics
from tests.control.test_view import ME, A, B, make_view


def test_our_metrics_are_the_workers_report_as_it_stands() -> None:
    view, _ = make_view(peers=(A, B))
    state = NodeState(
        seed=bytes(range(1, 33)),
        role="control-only",
        peer_id=ME,
        host=cast(Any, None),
        view=view,
        hardware={},
        clock=lambda: 100.0,
    )
    link = WorkerLink(state, "/nonexistent/ipc.sock", print_progress=False)
    report = MetricsReport(
        step=7,
        loss=2.25,
        tokens_per_s=123.0,
        stage=1,
        replica=0,
        samples=4,
        averaging="averaged",
        step_s=0.5,
        epoch=2,
        term=1,
        num_replicas=2,
        bytes_sent=1000,
        bytes_received=2000,
        start_step=3,
        start_lineage="root",
        resume_never=True,
    )
    link._on_message(report)
    link._on_message(report)
    metrics = view.own_metrics
    assert isinstance(metrics, PeerMetrics)
    assert {name: getattr(metrics, name) for name in AS_REPORTED} == {
        name: getattr(report, name) for name in AS_REPORTED
    }
    assert metrics.averaging == {"averaged": 2}  # the outcomes so far
    assert metrics.step == 7 and metrics.start_lineage == "root" and metrics.resume_never
