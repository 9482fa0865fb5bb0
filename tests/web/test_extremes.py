"""Issue 26, finding 8: whatever finite numbers peers report, the dashboard neither crashes nor
writes non-standard JSON (two last stages reporting loss 1e308 overflowed `fsum` and ended every
`--http` node; `Infinity` reached the JSON)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from p2ptrain import identity
from p2ptrain.control.status import swarm_status
from p2ptrain.control.view import Member, SwarmView
from p2ptrain.records import LinkReport, PeerMetrics, PeerRecord, SwarmStatus
from p2ptrain.web.history import SwarmHistory, mean, median, plan_text
from p2ptrain.web.server import Dashboard, json_bytes
from tests.web.synthetic import peer_ids, swarm

EXTREMES = (1e308, -1e308, 1e-308, -1e-308, sys.float_info.max, 5e-324)


def _standard(body: bytes) -> object:
    """The JSON, refusing Infinity and NaN (what browsers' JSON.parse refuses too)."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(body, parse_constant=refuse)


def _every_float(status: SwarmStatus, value: float) -> SwarmStatus:
    """Each peer's reported numbers, the links' and the plan's costs, all `value`."""
    peers = tuple(
        dataclasses.replace(
            p,
            compute_gflops=value,
            metrics=dataclasses.replace(
                p.metrics,
                loss=None if p.metrics.loss is None else value,
                tokens_per_s=value,
                step_s=value,
            ),
        )
        if p.metrics is not None
        else p
        for p in status.peers
    )
    links = tuple(dataclasses.replace(x, rtt_ms=value, bandwidth_mbps=value) for x in status.links)
    assert status.plan is not None
    plan = dataclasses.replace(status.plan, cost_s=abs(value), previous_cost_s=5e-324)
    return dataclasses.replace(status, peers=peers, links=links, plan=plan)


@pytest.mark.parametrize("value", EXTREMES)
def test_extreme_reports_give_a_page_standard_json_and_metrics(value: float) -> None:
    ids = peer_ids(8)
    dashboard = Dashboard()
    dashboard.update(_every_float(swarm(8, ids=ids, step=4), value), 1.0)
    dashboard.update(_every_float(swarm(8, ids=ids, step=5, epoch=2, reason="drift"), value), 2.0)
    status = _standard(dashboard.snapshot.status)
    history = _standard(dashboard.snapshot.history)
    assert isinstance(status, dict) and isinstance(history, dict)
    losses = [p["loss"] for p in history["points"]]
    assert [p["step"] for p in history["points"]] == [4, 5]
    assert all(math.isfinite(x) for x in losses)
    if abs(value) >= 1e308:
        assert losses == [value, value]  # the mean of equal values is that value
        assert math.isfinite(history["points"][0]["tokens_per_s"])
    assert math.isfinite(history["measured_step_s"])
    families = list(text_string_to_metric_families(dashboard.snapshot.metrics.decode()))
    assert all(math.isfinite(s.value) for f in families for s in f.samples)


def test_opposite_extremes_average_to_zero_and_sums_stay_finite() -> None:
    assert mean([1e308, -1e308]) == 0.0
    assert mean([1e308, 1e308, 1e308]) == 1e308
    assert median([1e308, 1e308]) == 1e308 and median([1.0, 3.0, 9.0, 5.0]) == 4.0
    history = SwarmHistory()
    ids = peer_ids(8)
    status = _every_float(swarm(8, ids=ids), 1e308)
    last = {p[-1] for p in status.plan.pipelines} if status.plan else set()
    flipped = tuple(
        dataclasses.replace(p, metrics=dataclasses.replace(p.metrics, loss=-1e308))
        if p.id == min(last) and p.metrics is not None
        else p
        for p in status.peers
    )
    history.observe(dataclasses.replace(status, peers=flipped), 1.0)
    assert [(p.step, p.loss) for p in history.points] == [(10, 0.0)]
    assert history.points[0].tokens_per_s == sys.float_info.max  # the sum, clamped


def test_a_plan_priced_absurdly_reads_as_a_bounded_number() -> None:
    status = _every_float(swarm(8), 1e308)
    assert status.plan is not None
    text = plan_text(status.plan)
    assert "slower" in text and len(text) < 300


def test_json_bytes_never_writes_infinity_or_nan() -> None:
    body = json_bytes({"a": [math.inf, -math.inf, math.nan, 1e308], "b": (1.0, {"c": math.inf})})
    assert _standard(body) == {
        "a": [sys.float_info.max, -sys.float_info.max, 0.0, 1e308],
        "b": [1.0, {"c": sys.float_info.max}],
    }


def test_the_status_built_from_a_view_of_extreme_reports_is_standard_json() -> None:
    now = time.monotonic()
    me = identity.peer_id_of(bytes(32))
    view = SwarmView(self_id=me, role="control-only", planner_capable=False, started_at=now)
    record = PeerRecord(
        addrs=(),
        data_addrs=(),
        role="trainer",
        planner_capable=False,
        version="0",
        hardware={},
        compute_gflops=1e308,
    )
    peers = peer_ids(4)
    for i, peer in enumerate(peers):
        value = EXTREMES[i % len(EXTREMES)]
        metrics = PeerMetrics(step=1, loss=abs(value), tokens_per_s=abs(value), step_s=abs(value))
        view.members[peer] = Member(record, now, metrics)
        view.links.rows[peer] = (
            {p: LinkReport(abs(value), 0.0, abs(value), 0.0) for p in peers if p != peer},
            now,
        )
    status = swarm_status(view, now)
    assert len(status.links) == 6
    doc = json.dumps(status.to_dict(), allow_nan=False)  # the status RPC's reply
    assert SwarmStatus.from_dict(json.loads(doc)) == status
    dashboard = Dashboard()
    dashboard.update(status, 1.0)
    _standard(dashboard.snapshot.status)


def test_an_averaging_outcome_a_peer_made_up_is_no_metrics_series() -> None:
    """A peer's metrics may name up to 8 outcomes of any 16 characters: exported as labels, one
    identity renaming them every report minted series without bound in the scraper."""
    import dataclasses

    from p2ptrain.web.metrics import StatusCollector
    from tests.web.synthetic import swarm

    status = swarm(8)
    peer = next(p for p in status.peers if p.metrics is not None)
    assert peer.metrics is not None
    made_up = dataclasses.replace(peer.metrics, averaging={"averaged": 3, "x1f9q": 7})
    status = dataclasses.replace(
        status,
        peers=tuple(
            dataclasses.replace(p, metrics=made_up) if p is peer else p for p in status.peers
        ),
    )
    families = {f.name: f for f in StatusCollector(status, None).collect()}
    outcomes = {s.labels["outcome"] for s in families["p2ptrain_averaging_rounds"].samples}
    ours = {
        s.labels["outcome"]
        for s in families["p2ptrain_averaging_rounds"].samples
        if s.labels["peer"] == peer.id
    }
    assert outcomes == {"averaged"} and ours == {"averaged"}
