import pytest

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.worker.frames import ACTIVATION, GRADIENT
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
