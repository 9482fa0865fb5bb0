import pytest

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.worker.frames import ACTIVATION, GRADIENT
from p2ptrain.worker.local_swarm import StepStats, plan_for, plan_layout
from p2ptrain.worker.pipeline import expected_frame
from p2ptrain.worker.role import check_plan, role_in_plan

PLAN = {"term": 1, "epoch": 4, "stages": 2, "pipelines": [["a", "b"], ["c", "d"]], "spares": ["e"]}


def test_roles_follow_the_pipelines() -> None:
    b = role_in_plan(PLAN, "b")
    assert b is not None
    assert (b.stage, b.replica, b.num_replicas, b.epoch) == (1, 0, 2, 4)
    assert (b.prev_peer, b.next_peer, b.stage_peers) == ("a", None, ("b", "d"))
    assert b.is_last and not b.is_first
    assert role_in_plan(PLAN, "e") is None  # a spare


@pytest.mark.parametrize(
    "bad",
    [
        {**PLAN, "pipelines": [["a", "b"], ["c"]]},
        {**PLAN, "pipelines": [["a", "b"], ["c", "a"]]},
        {**PLAN, "stages": 0},
        {**PLAN, "epoch": "x"},
        {**PLAN, "data_addrs": {"a": "not-a-list"}},
    ],
)
def test_malformed_plans_are_refused(bad: dict) -> None:
    with pytest.raises(UserError):
        check_plan(bad)


def test_each_stage_accepts_only_its_neighbours_frames() -> None:
    spec = RunSpec(batch_size=8, micro_batches=2, block_size=16, n_embd=32, n_head=2)
    first, last = role_in_plan(PLAN, "c"), role_in_plan(PLAN, "d")
    assert first is not None and last is not None
    act = expected_frame(spec, last, 5, ACTIVATION, 5, 1)
    assert act is not None and (act.sender, act.shape, act.dtype, act.epoch) == (
        "c",
        (2, 16, 32),
        "float16",
        4,
    )
    assert expected_frame(spec, last, 5, ACTIVATION, 6, 0) is not None  # the first stage runs ahead
    assert expected_frame(spec, last, 5, ACTIVATION, 4, 0) is None  # stale
    assert expected_frame(spec, last, 5, ACTIVATION, 5, 2) is None  # no such micro-batch
    assert (
        expected_frame(spec, last, 5, GRADIENT, 5, 0) is None
    )  # nobody sends the last stage grads
    grad = expected_frame(spec.replace(compression="none"), first, 5, GRADIENT, 5, 0)
    assert grad is not None and (grad.sender, grad.dtype) == ("d", "float32")


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
