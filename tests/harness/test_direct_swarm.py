"""The direct swarm's own pieces: the plan it makes for a loopback swarm, its global loss."""

import pytest

from p2ptrain.harness.direct_swarm import StepStats, plan_for, plan_layout
from p2ptrain.records import Hello, Plan, RunSpec


def test_local_layouts_and_plans() -> None:
    spec = RunSpec().replace(stages=2)
    assert plan_layout(spec, 4) == (2, 2)
    assert plan_layout(spec, 5) == (2, 2)
    assert plan_layout(spec, 1) == (1, 1)
    hellos = [Hello(f"p{i}", (f"/ip4/127.0.0.1/tcp/{i + 1}",), 100 + i) for i in range(5)]
    plan = plan_for(spec, hellos)
    assert Plan.from_dict(plan.to_dict()) == plan  # a valid record
    placed = [p for pipeline in plan.pipelines for p in pipeline]
    assert plan.num_replicas == 2 and len(placed) == 4 and len(plan.spares) == 1
    assert sorted(placed + list(plan.spares)) == [f"p{i}" for i in range(5)]


def test_global_loss_weighs_replicas_by_rows() -> None:
    stats = StepStats(losses={0: 2.0, 1: 4.0}, samples={0: 3, 1: 1})
    assert stats.global_loss() == pytest.approx(2.5)
