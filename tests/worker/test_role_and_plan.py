"""A plan's roles decide which frames a stage accepts (worker/pipeline/stage_step.py)."""

from p2ptrain.records import Plan, PlanMessage, RunSpec
from p2ptrain.worker.pipeline.frames import ACTIVATION, GRADIENT
from p2ptrain.worker.pipeline.stage_step import expected_frame

PLAN = Plan.from_dict(
    {
        "term": 1,
        "epoch": 4,
        "planner": "a",
        "stages": 2,
        "pipelines": [["a", "b"], ["c", "d"]],
        "spares": ["e"],
        "data_addrs": {},
        "cost_s": 0.0,
    }
)


def test_each_stage_accepts_only_its_neighbours_frames() -> None:
    spec = RunSpec().replace(batch_size=8, micro_batches=2, block_size=16, n_embd=32, n_head=2)
    first, last = PLAN.role_of("c"), PLAN.role_of("d")
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


def test_a_worker_waits_instead_of_training_on_a_plan_it_cannot_take() -> None:
    from p2ptrain.worker.plan_readiness import why_not_actionable

    spec = RunSpec().replace(stages=2, n_layer=2)
    addrs = {p: ("/ip4/127.0.0.1/tcp/1",) for p in "abcde"}
    fine = PlanMessage(PLAN.replace(data_addrs=addrs), spec)
    assert why_not_actionable(fine, "a") == ""
    too_deep = PlanMessage(
        PLAN.replace(stages=3, pipelines=(("a", "b", "c"),), data_addrs=addrs), spec
    )
    assert "cannot cut the model" in why_not_actionable(too_deep, "a")
    uneven = PlanMessage(PLAN.replace(data_addrs=addrs, stage_layers=(2, 1)), spec)
    assert "sum" in why_not_actionable(uneven, "a")  # 3 layers for a 2-layer model
    assert "no data-plane address" in why_not_actionable(PlanMessage(PLAN, spec), "a")
