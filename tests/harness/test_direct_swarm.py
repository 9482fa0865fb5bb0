"""The direct swarm's own pieces: the plan it makes for a loopback swarm, its global loss."""

import pytest

from p2ptrain.harness.direct_swarm import StepStats, plan_for, plan_layout
from p2ptrain.records.run import RunSpec
from p2ptrain.worker.role import check_plan


def test_local_layouts_and_plans() -> None:
    spec = RunSpec(stages=2)
    assert plan_layout(spec, 4) == (2, 2)
    assert plan_layout(spec, 5) == (2, 2)
    assert plan_layout(spec, 1) == (1, 1)
    hellos = [{"peer_id": f"p{i}", "data_addrs": [f"/ip4/127.0.0.1/tcp/{i + 1}"]} for i in range(5)]
    plan = plan_for(spec, hellos)
    check_plan(plan)
    placed = [p for pipeline in plan["pipelines"] for p in pipeline]
    assert len(plan["pipelines"]) == 2 and len(placed) == 4 and len(plan["spares"]) == 1
    assert sorted(placed + plan["spares"]) == [f"p{i}" for i in range(5)]


def test_global_loss_weighs_replicas_by_rows() -> None:
    stats = StepStats(losses={0: 2.0, 1: 4.0}, samples={0: 3, 1: 1})
    assert stats.global_loss() == pytest.approx(2.5)
