"""sync = "diloco" in the scheduler: the outer round's bytes (wire_bytes.py, against the codecs),
its cost spread over H and overlapped with the inner steps (cost.py, step_time.py,
outer_round.py), int8 activations, and shapes chosen by tokens a second (shapes.py); cases
small enough to compute by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from p2ptrain.records import RunSpec
from p2ptrain.schedule import Topology, Workload
from p2ptrain.schedule.compute import PeerCompute
from p2ptrain.schedule.cost import CostModel
from p2ptrain.schedule.outer_round import group_gather_s, overlapped_step_s, round_cpu_share_s
from p2ptrain.schedule.planner import Schedule
from p2ptrain.schedule.shapes import plan_best_shape
from p2ptrain.schedule.step_sim import MeasuredCompute, simulated_step_s
from p2ptrain.schedule.step_time import StepTraffic, group_averaging_s, step_time
from p2ptrain.schedule.wire_bytes import activation_row_bytes, outer_payload_bytes
from p2ptrain.schedule.workload import (
    measured_workload,
    stage_parameter_counts,
    step_traffic,
    tokens_per_step,
)

MBIT = 1e6 / 1e9  # 1 Mbit/s in the topology's Gbit/s
DILOCO = RunSpec().replace(sync="diloco", inner_steps=10)


def test_outer_payloads_are_the_codecs_byte_counts() -> None:
    torch = pytest.importorskip("torch")
    codecs = pytest.importorskip("p2ptrain.train.codecs")
    activation_codecs = pytest.importorskip("p2ptrain.train.activation_codecs")
    for numel in (1, 255, 256, 4097, 100_003):
        values = torch.randn(numel)
        assert outer_payload_bytes("fp16", numel, 0.03) == codecs.encode_fp16(values).numel()
        int8 = codecs.encode_int8_blocks(values).numel()
        assert outer_payload_bytes("int8", numel, 0.03) == int8
        for fraction in (0.03, 0.01, 0.5):
            sent, _ = codecs.encode_topk(values, fraction)
            assert outer_payload_bytes("topk", numel, fraction) == sent.numel()
    rows = torch.randn(3, 5, 128)  # (B, T, C): a scale a token
    assert (
        15 * activation_row_bytes("int8", 128) == activation_codecs.encode_int8_rows(rows).numel()
    )
    # about a byte a value for int8, 0.055 for the top 3% at 2 bits (36x fewer than fp16)
    assert outer_payload_bytes("int8", 256_000, 0.03) / 256_000 == pytest.approx(1.016, abs=1e-3)
    assert outer_payload_bytes("topk", 4096 * 100, 0.03) / (4096 * 100) == pytest.approx(
        (123 * 1.75 + 8) / 4096
    )


def test_diloco_exchanges_the_compressed_pseudo_gradient_once_every_h_steps() -> None:
    counts = stage_parameter_counts(DILOCO, 2)
    for codec in ("fp16", "int8", "topk"):
        run = DILOCO.replace(outer_compression=codec)
        work = measured_workload(run, 2, 2)
        assert work.steps_per_sync == 10
        payload = max(outer_payload_bytes(codec, c, run.wire.topk_fraction) for c in counts)
        assert work.c_dp_gb == pytest.approx(payload / 1e9)  # R = 2: a gather moves as much
        traffic = step_traffic(run, 2, 2)
        assert traffic.inner_steps == 10 and traffic.sparse_gather == (codec == "topk")
        assert traffic.stage_gradient_bytes == tuple(
            outer_payload_bytes(codec, c, run.wire.topk_fraction) for c in counts
        )
    # top-k's sparse gather: every link carries each member's whole payload, R/2 x all-reduce's
    topk = DILOCO.replace(outer_compression="topk")
    assert measured_workload(topk, 2, 4).c_dp_gb == pytest.approx(
        2 * measured_workload(topk, 2, 2).c_dp_gb
    )
    step = RunSpec()
    assert measured_workload(step, 2, 2).steps_per_sync == 1
    assert step_traffic(step, 2, 2).inner_steps == 0
    assert step_traffic(step, 2, 2).stage_gradient_bytes == tuple(2.0 * c for c in counts)


def test_batch_size_is_per_replica_under_diloco_and_global_under_step() -> None:
    step, diloco = RunSpec().replace(batch_size=16), DILOCO.replace(batch_size=16)
    assert tokens_per_step(step, 1) == tokens_per_step(step, 4) == 16 * 64
    assert tokens_per_step(diloco, 4) == 4 * 16 * 64
    # a replica's activations: a quarter of the global batch under step, its own under diloco
    assert measured_workload(step, 2, 4).c_pp_gb == pytest.approx(4 * 64 * 128 * 2 / 1e9)
    assert measured_workload(diloco, 2, 4).c_pp_gb == pytest.approx(16 * 64 * 128 * 2 / 1e9)
    assert step_traffic(diloco, 2, 4).activation_bytes == 8 * 64 * 128 * 2  # 2 micro-batches
    assert step_traffic(step, 2, 4).activation_bytes == 2 * 64 * 128 * 2
    # the compute term: a micro-batch of 8 rows per replica under diloco, 2 under step
    block = np.full(4, 1e-3)
    compute = PeerCompute(block, block, block, 4, 16, 2)
    assert compute.micro_rows(4) == 2
    per_replica = dataclasses.replace(compute, batch_per_replica=True)
    assert per_replica.micro_rows(4) == 8
    assert per_replica.stage_table(2, 4)[0, 0] == pytest.approx(8 * (2 * 1e-3 + 1e-3))


def test_int8_activations_halve_the_pipeline_traffic() -> None:
    fp16, int8 = RunSpec(), RunSpec().replace(compression="int8")
    # a token's 128 values: 256 bytes at fp16, 128 + a 4-byte scale at int8
    ratio = (128 + 4) / 256
    assert (
        step_traffic(int8, 2, 2).activation_bytes
        == ratio * step_traffic(fp16, 2, 2).activation_bytes
    )
    assert measured_workload(int8, 2, 2).c_pp_gb == pytest.approx(
        ratio * measured_workload(fp16, 2, 2).c_pp_gb
    )
    # averaging stays fp16
    assert (
        step_traffic(int8, 2, 2).stage_gradient_bytes
        == step_traffic(fp16, 2, 2).stage_gradient_bytes
    )


def test_the_paper_cost_spreads_one_exchange_over_h_steps() -> None:
    # two peers 50 ms apart at 10 Mbit/s, 1 MB a stage, 2 replicas of 1 stage:
    # an exchange costs 2 x (0.05 + 8 Mbit / (2 x 10 Mbit/s)) = 0.9 s, a tenth of it a step
    delay = np.array([[0.0, 50.0], [50.0, 0.0]])
    bandwidth = np.full((2, 2), 10 * MBIT)
    topology = Topology(["a", "b"], delay, bandwidth)
    every_step = CostModel.build(topology, Workload(1, 2, 0.001, 0.0))
    diloco = CostModel.build(topology, Workload(1, 2, 0.001, 0.0, steps_per_sync=10))
    assert every_step.dp_pair[0, 1] == pytest.approx(0.9)
    assert diloco.dp_pair[0, 1] == pytest.approx(0.09)


def two_replicas() -> tuple[np.ndarray, np.ndarray]:
    """Two one-stage replicas 100 ms apart at 8 Mbit/s: averaging 1 MB takes 1.2 s."""
    return np.array([[0.0, 100.0], [100.0, 0.0]]), np.full((2, 2), 8 * MBIT)


def test_a_round_shorter_than_h_steps_costs_the_step_nothing() -> None:
    delay, rate = two_replicas()
    assert group_averaging_s(delay / 1e3, rate * 1e9, [0, 1], 1_000_000) == pytest.approx(1.2)
    compute = MeasuredCompute([[0.1]] * 2, [[0.2]] * 2, [[0.0]] * 2)
    pipes = [[0], [1]]

    def step_s(inner_steps: int) -> float:
        traffic = StepTraffic((1_000_000,), 0.0, 1, inner_steps=inner_steps)
        return simulated_step_s(delay, rate, pipes, traffic, compute)

    assert step_s(0) == pytest.approx(0.3 + 1.2)  # every step: compute, then the averaging
    assert step_s(10) == pytest.approx(0.3)  # 1.2 s beside 10 x 0.3 s of inner steps: hidden
    assert step_s(2) == pytest.approx(1.2 / 2)  # longer than 2 steps: the steps wait for it
    # the round's local CPU is spread over the H steps on each member's machine
    local = dataclasses.replace(compute, averaging_local_s=[[0.5]] * 2)
    traffic = StepTraffic((1_000_000,), 0.0, 1, inner_steps=10)
    assert simulated_step_s(delay, rate, pipes, traffic, local) == pytest.approx(0.3 + 0.05)
    # communication only: the passes (none here), or the round over H
    assert step_time(delay, rate, pipes, traffic).comm_s == pytest.approx(0.12)
    assert step_time(delay, rate, pipes, StepTraffic((1e6,), 0.0, 1)).comm_s == pytest.approx(1.2)
    assert overlapped_step_s(0.3, [0.9, 1.2], 10) == 0.3 and overlapped_step_s(
        0.1, [1.2], 10
    ) == pytest.approx(0.12)


def test_a_sparse_gather_sends_each_payload_on_every_link_at_once() -> None:
    # three members 100 ms apart at 8 Mbit/s, 0.1 MB each: metadata 0.1 s, then every payload
    # on its own link: 0.1 s + 0.1 s
    delay = np.full((3, 3), 0.1)
    np.fill_diagonal(delay, 0.0)
    rate = np.full((3, 3), 8e6)
    assert group_gather_s(delay, rate, [0, 1, 2], 100_000) == pytest.approx(0.3)
    assert group_gather_s(delay, rate, [2], 100_000) == 0.0
    traffic = StepTraffic((100_000,), 0.0, 1, inner_steps=1, sparse_gather=True)
    compute = MeasuredCompute([[0.0]] * 3, [[0.0]] * 3, [[0.0]] * 3)
    assert simulated_step_s(delay * 1e3, rate / 1e9, [[0], [1], [2]], traffic, compute) == (
        pytest.approx(0.3)
    )


def test_shapes_are_compared_by_tokens_a_second() -> None:
    """A step model that runs 2 replicas in 1.5 s and 1 in 1.0 s: with the global batch split
    (step) one replica wins (1.0 < 0.8 x 1.5); with a batch each (diloco), two train 2 x the
    tokens in 1.5 s: 0.75 s a replica's batch, so both stay."""
    delay = np.full((4, 4), 5.0)
    np.fill_diagonal(delay, 0.0)
    topology = Topology([f"p{i}" for i in range(4)], delay, np.ones((4, 4)))

    def workload(stages: int, replicas: int, layers: object = ()) -> Workload:
        return Workload(stages, replicas, 0.001, 0.001)

    def step_model(plan: Schedule, _: Topology) -> float:
        return {1: 1.0, 2: 1.5}[plan.replicas]

    shapes = [(2, 2), (2, 1)]
    kept = plan_best_shape(topology, shapes, workload, step_model=step_model)
    assert kept.replicas == 1 and len(kept.spares) == 2
    both = plan_best_shape(
        topology, shapes, workload, step_model=step_model, tokens_per_step=lambda r: r * 1024.0
    )
    assert both.replicas == 2 and not both.spares


def test_a_rounds_cpu_lands_in_the_pipelines_idle_time_first() -> None:
    """Two stages, two replicas: each stage waits for the other half the step (a bubble), so a
    round's local CPU that fits in H bubbles costs no step anything (the worker's median step
    has none of it); only the excess is spread over H."""
    delay, rate = np.zeros((4, 4)), np.full((4, 4), 1e3 * MBIT)
    compute = MeasuredCompute([[0.1, 0.1]] * 2, [[0.2, 0.2]] * 2, [[0.0, 0.0]] * 2)
    pipes = [[0, 1], [2, 3]]
    traffic = StepTraffic((1000.0, 1000.0), 0.0, 1, inner_steps=10)
    plain = simulated_step_s(delay, rate, pipes, traffic, compute)
    assert plain == pytest.approx(0.6)  # each stage busy 0.3 s of a 0.6 s step
    fits = dataclasses.replace(compute, averaging_local_s=[[2.0, 2.0]] * 2)
    assert simulated_step_s(delay, rate, pipes, traffic, fits) == pytest.approx(plain)
    over = dataclasses.replace(compute, averaging_local_s=[[5.0, 5.0]] * 2)
    assert simulated_step_s(delay, rate, pipes, traffic, over) == pytest.approx(plain + 0.2)
    assert round_cpu_share_s(0.6, 0.3, None, 5.0, 10) == pytest.approx(0.2)
