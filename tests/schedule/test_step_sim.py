"""The simulated step (schedule/step_time.py's simulated_step_s) on cases computed by hand, and
against the communication-only model where compute is zero."""

from __future__ import annotations

import numpy as np
import pytest

from p2ptrain.schedule.step_time import (
    MeasuredCompute,
    StepTraffic,
    simulated_step_s,
    step_time,
)

MBIT = 1e6 / 1e9  # 1 Mbit/s in the topology's Gbit/s


def uniform(replicas: int, stages: int, forward: float, backward: float, update: float = 0.0):
    def grid(value: float) -> list[list[float]]:
        return [[value] * stages for _ in range(replicas)]

    return MeasuredCompute(grid(forward), grid(backward), grid(update))


def instant_links(peers: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((peers, peers)), np.full((peers, peers), 1e9)  # no delay, ~infinite rate


def test_one_stage_computes_every_micro_batch_both_ways_then_updates() -> None:
    delay, rate = instant_links(1)
    traffic = StepTraffic((0.0,), activation_bytes=0.0, micro_batches=3)
    step = simulated_step_s(delay, rate, [[0]], traffic, uniform(1, 1, 0.1, 0.2, 0.05))
    assert step == pytest.approx(3 * 0.1 + 3 * 0.2 + 0.05)


def test_gpipe_bubble_on_instant_links() -> None:
    # 2 stages, 2 micro-batches, forward = backward = 1 s: (stages + micro - 1) x (f + b) = 6 s
    delay, rate = instant_links(2)
    traffic = StepTraffic((0.0, 0.0), activation_bytes=0.0, micro_batches=2)
    step = simulated_step_s(delay, rate, [[0, 1]], traffic, uniform(1, 2, 1.0, 1.0))
    assert step == pytest.approx(6.0)


def test_zero_compute_is_the_communication_model() -> None:
    rng = np.random.default_rng(3)
    delay = rng.uniform(5, 80, (4, 4))
    rate = rng.uniform(5, 50, (4, 4)) * MBIT
    traffic = StepTraffic((1e5,) * 4, activation_bytes=64_000, micro_batches=4)
    pipe = [[2, 0, 3, 1]]
    step = simulated_step_s(delay, rate, pipe, traffic, uniform(1, 4, 0.0, 0.0))
    assert step == pytest.approx(step_time(delay, rate, pipe, traffic).comm_s)


def test_averaging_waits_for_the_slower_replica() -> None:
    # two one-stage replicas 100 ms apart at 8 Mbit/s, 1 MB gradient: averaging 1.3 s
    # (test_step_time's group of two); replica 1 computes 0.5 s longer
    delay = np.array([[0.0, 100.0], [100.0, 0.0]])
    rate = np.full((2, 2), 8 * MBIT)
    traffic = StepTraffic((1_000_000,), activation_bytes=0.0, micro_batches=1)
    compute = MeasuredCompute([[0.2], [0.7]], [[0.0], [0.0]], [[0.0], [0.0]])
    step = simulated_step_s(delay, rate, [[0], [1]], traffic, compute)
    assert step == pytest.approx(0.7 + 1.3)


def test_frames_overlap_compute() -> None:
    # 2 stages, frames of 1 s serialisation on a link with no delay, 1 s compute per micro-batch
    # each way: the bubble's 10 s, plus one frame's wait each way (the others overlap compute)
    delay = np.zeros((2, 2))
    rate = np.full((2, 2), 8 * MBIT)
    traffic = StepTraffic((0.0, 0.0), activation_bytes=1_000_000, micro_batches=4)
    step = simulated_step_s(delay, rate, [[0, 1]], traffic, uniform(1, 2, 1.0, 1.0))
    assert step == pytest.approx((2 + 4 - 1) * 2.0 + 2 * 1.0)


def test_a_rounds_measured_local_work_adds_its_slowest_members() -> None:
    """The averaging round's local work (serialising, reducing: the workers' CPU in the round at
    their quota) follows the links' part: the slowest member's is added, once per step; a
    stage without a group (one replica) has no round and adds nothing."""
    delay = np.array([[0.0, 100.0], [100.0, 0.0]])
    rate = np.full((2, 2), 8 * MBIT)
    traffic = StepTraffic((1_000_000,), activation_bytes=0.0, micro_batches=1)
    plain = uniform(2, 1, 0.1, 0.2)
    local = MeasuredCompute(plain.forward_s, plain.backward_s, plain.update_s, [[0.05], [0.25]])
    without = simulated_step_s(delay, rate, [[0], [1]], traffic, plain)
    assert simulated_step_s(delay, rate, [[0], [1]], traffic, local) == pytest.approx(
        without + 0.25
    )
    solo = MeasuredCompute([[0.1]], [[0.2]], [[0.0]], [[0.25]])
    one = StepTraffic((1_000_000,), activation_bytes=0.0, micro_batches=1)
    assert simulated_step_s(delay, rate, [[0]], one, solo) == pytest.approx(0.3)


def test_each_frame_a_stage_sends_or_takes_in_costs_its_local_work() -> None:
    """2 stages, 1 micro-batch, instant links, no compute: stage 0 sends the activation (f0),
    stage 1 takes it in (f1) and sends the gradient back (f1), stage 0 takes it in (f0)."""
    delay, rate = instant_links(2)
    traffic = StepTraffic((0.0, 0.0), activation_bytes=0.0, micro_batches=1)
    free = uniform(1, 2, 0.0, 0.0)
    f0, f1 = 0.01, 0.03
    costly = MeasuredCompute(free.forward_s, free.backward_s, free.update_s, (), [[f0, f1]])
    assert simulated_step_s(delay, rate, [[0, 1]], traffic, free) == pytest.approx(0.0)
    assert simulated_step_s(delay, rate, [[0, 1]], traffic, costly) == pytest.approx(
        2 * f0 + 2 * f1
    )
    # 2 micro-batches: stage 0's second send overlaps stage 1 taking in the first; then stage
    # 1 takes in both, sends both back, and stage 0 takes in the last: f0 + 4 f1 + f0
    traffic = StepTraffic((0.0, 0.0), activation_bytes=0.0, micro_batches=2)
    two = simulated_step_s(delay, rate, [[0, 1]], traffic, costly)
    assert two == pytest.approx(2 * f0 + 4 * f1)
