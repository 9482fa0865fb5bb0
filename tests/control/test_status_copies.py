"""`p2ptrain status` shows the spares' copies of stages one peer alone holds (worker/resume/
copies.py): the worker's CopyReport reaches its node's gossiped metrics, the status document
and the table, and a trainer's next report has none."""

from __future__ import annotations

from typing import Any, cast

from p2ptrain.cli.status_cmd import format_status
from p2ptrain.control.state import NodeState
from p2ptrain.control.status import swarm_status
from p2ptrain.control.worker_link import WorkerLink
from p2ptrain.records import CopyReport, MetricsReport, Plan, StageCopy, SwarmStatus
from tests.control.test_view import ME, A, B, C, make_view
from tests.records.samples import metrics_dict


def _copies(step: int | None) -> tuple[StageCopy, ...]:
    return (StageCopy(0, 2, A, step), StageCopy(2, 4, B))


def test_a_spares_copy_report_is_its_metrics_until_it_trains() -> None:
    view, _ = make_view(peers=(A, B))
    state = NodeState(bytes(range(1, 33)), "control-only", ME, cast(Any, None), view, {})
    link = WorkerLink(state, "/nonexistent/ipc.sock", print_progress=False)
    link._on_message(CopyReport(_copies(None), 1, 2))
    assert view.own_metrics is not None and view.own_metrics.copies == _copies(None)
    link._on_message(CopyReport(_copies(1320), 1, 2))
    assert view.own_metrics.copies_under((1, 2)) == _copies(1320)
    assert view.own_metrics.copies_under((1, 3)) == ()  # another plan's: not shown under it
    link._on_message(MetricsReport.from_dict(metrics_dict()))  # placed at a stage: no duties
    assert view.own_metrics.copies == () and view.own_metrics.step == 3


def test_status_shows_what_each_spare_of_the_plan_holds_of_the_lone_holders() -> None:
    v, feed = make_view()
    copies = [c.to_dict() for c in _copies(1320)]
    metrics = {"step": None, "copies": copies, "copies_plan": [1, 2]}
    v.accept(feed("telemetry", C, {"links": {}, "metrics": metrics}), 0.1)
    v.plan = Plan(1, 2, A, 2, ((A, B),), (C,), {}, 1.0)
    document = swarm_status(v, 0.2).to_dict()
    assert SwarmStatus.from_dict(document).to_dict() == document  # what --json prints
    peer = next(p for p in document["peers"] if p["id"] == C)
    assert peer["metrics"]["copies"][0] == {"first": 0, "end": 2, "holder": A, "step": 1320}
    table = format_status(SwarmStatus.from_dict(document))
    assert f"copy of L0-2 (…{A[-8:]}): copied at step 1320 on …{C[-8:]}" in table
    assert f"copy of L2-4 (…{B[-8:]}): no copy yet on …{C[-8:]}" in table
    # a spare still, of the next plan: what it reported was the last plan's until it reports again
    v.plan = Plan(1, 3, A, 2, ((A, B),), (C,), {}, 1.0)
    assert "copy of" not in format_status(swarm_status(v, 0.3))
    # no longer a spare of the plan
    v.plan = Plan(1, 2, A, 2, ((A, B), (C, ME)), (), {}, 1.0)
    assert "copy of" not in format_status(swarm_status(v, 0.3))


def test_status_marks_the_spare_that_stays_only_to_hand_its_stage_over() -> None:
    v, _ = make_view()
    v.plan = Plan(1, 2, A, 2, ((A, B),), (C, ME), {}, 1.0, donors=(ME,))
    document = swarm_status(v, 0.2).to_dict()
    assert document["plan"]["donors"] == [ME]
    assert SwarmStatus.from_dict(document).to_dict() == document
    table = format_status(SwarmStatus.from_dict(document))
    assert f"spares: …{C[-8:]}, …{ME[-8:]} (handing its stage over)" in table
