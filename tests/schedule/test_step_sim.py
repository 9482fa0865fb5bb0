"""The simulated step (schedule/step_sim.py's simulated_step_s) on cases computed by hand, and
against the communication-only model where compute is zero."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from p2ptrain.schedule.cpu_budget import CpuBudget
from p2ptrain.schedule.step_sim import MeasuredCompute, simulated_step_s
from p2ptrain.schedule.step_time import StepTraffic, group_averaging_s, step_time

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
    # two one-stage replicas 100 ms apart at 8 Mbit/s, 1 MB gradient: averaging 1.2 s
    # (test_step_time's group of two); replica 1 computes 0.5 s longer
    delay = np.array([[0.0, 100.0], [100.0, 0.0]])
    rate = np.full((2, 2), 8 * MBIT)
    traffic = StepTraffic((1_000_000,), activation_bytes=0.0, micro_batches=1)
    compute = MeasuredCompute([[0.2], [0.7]], [[0.0], [0.0]], [[0.0], [0.0]])
    step = simulated_step_s(delay, rate, [[0], [1]], traffic, compute)
    assert step == pytest.approx(0.7 + 1.2)


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


def test_a_rounds_work_beside_the_wire_hides_behind_it_up_to_the_links_time() -> None:
    """Of a round's local work, what runs before its first part leaves and after its last part
    arrived adds to the step; what runs while parts are on the wire adds only what outlasts the
    links' 1.2 s (the group of two above)."""
    delay = np.array([[0.0, 100.0], [100.0, 0.0]])
    rate = np.full((2, 2), 8 * MBIT)
    traffic = StepTraffic((1_000_000,), activation_bytes=0.0, micro_batches=1)
    plain = uniform(2, 1, 0.1, 0.2)
    without = simulated_step_s(delay, rate, [[0], [1]], traffic, plain)

    def split(total: float, before: float, after: float) -> MeasuredCompute:
        return MeasuredCompute(
            plain.forward_s,
            plain.backward_s,
            plain.update_s,
            [[total]] * 2,
            averaging_before_s=[[before]] * 2,
            averaging_after_s=[[after]] * 2,
        )

    hidden = split(0.5, 0.1, 0.1)  # 0.3 s beside the wire: hidden
    assert simulated_step_s(delay, rate, [[0], [1]], traffic, hidden) == pytest.approx(
        without + 0.2
    )
    outlasting = split(1.7, 0.1, 0.1)  # 1.5 s beside a 1.2 s wire: 0.3 s of it shows
    assert simulated_step_s(delay, rate, [[0], [1]], traffic, outlasting) == pytest.approx(
        without + 0.2 + 0.3
    )
    # unsplit (an older worker): all of it before the wire, as above
    whole = MeasuredCompute(plain.forward_s, plain.backward_s, plain.update_s, [[0.5]] * 2)
    assert simulated_step_s(delay, rate, [[0], [1]], traffic, whole) == pytest.approx(without + 0.5)


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


def test_a_cpu_quota_runs_bursts_at_full_speed_and_long_work_at_its_share() -> None:
    # a quarter core handed out as 10 ms of every 40 ms period (Linux CFS)
    machine = CpuBudget(0.25, 0.04)
    assert machine.run(0.0, 0.004) == pytest.approx(0.004)  # within the slice: full speed
    # 6 ms of the slice left: the rest of this 10 ms waits for the next period
    assert machine.run(0.004, 0.010) == pytest.approx(0.040 + 0.004)
    # 0.1 s of CPU from an idle start: 10 slices, the last one ends 10 ms into its period
    assert CpuBudget(0.25, 0.04).run(0.2, 0.1) == pytest.approx(0.2 + 9 * 0.04 + 0.01)
    assert CpuBudget().run(1.0, 0.3) == pytest.approx(1.3)  # no quota: its CPU seconds
    with pytest.raises(ValueError):
        CpuBudget(0.0, 0.04)


def quota(compute: MeasuredCompute, cores: float, period_s: float) -> MeasuredCompute:
    grid = [[cores] * len(row) for row in compute.forward_s]
    return dataclasses.replace(
        compute, quota_cores=grid, quota_period_s=[[period_s] * len(r) for r in grid]
    )


def test_a_step_that_never_waits_runs_at_the_quota_share() -> None:
    # one stage, 10 ms of CPU a step, back to back: a quarter core takes 40 ms a step
    delay, rate = instant_links(1)
    traffic = StepTraffic((0.0,), activation_bytes=0.0, micro_batches=1)
    compute = uniform(1, 1, 0.004, 0.006)
    assert simulated_step_s(delay, rate, [[0]], traffic, compute) == pytest.approx(0.010)
    limited = quota(compute, 0.25, 0.04)
    assert simulated_step_s(delay, rate, [[0]], traffic, limited) == pytest.approx(0.040)


def test_a_steady_background_leaves_the_stage_less_of_its_quota() -> None:
    # as above with 50 ms periods, the helper processes taking 0.05 core steadily: the stage's
    # 10 ms of CPU runs on the 0.2 core left, a 10 ms slice of each period: 50 ms a step
    delay, rate = instant_links(1)
    traffic = StepTraffic((0.0,), activation_bytes=0.0, micro_batches=1)
    limited = quota(uniform(1, 1, 0.004, 0.006), 0.25, 0.05)
    busy = dataclasses.replace(limited, background_cores=[[0.05]])
    assert simulated_step_s(delay, rate, [[0]], traffic, busy) == pytest.approx(0.050)
    # a background measured beyond the quota leaves the stage a tenth of it, not nothing
    swamped = dataclasses.replace(limited, background_cores=[[0.3]])
    assert simulated_step_s(delay, rate, [[0]], traffic, swamped) == pytest.approx(0.4)
    # without a quota, a background takes nothing from the stage
    free = dataclasses.replace(uniform(1, 1, 0.004, 0.006), background_cores=[[0.05]])
    assert simulated_step_s(delay, rate, [[0]], traffic, free) == pytest.approx(0.010)


def test_a_burst_after_waiting_on_the_network_runs_at_full_speed() -> None:
    # two one-stage replicas averaging over 50 ms links: each step's 8 ms of CPU comes after
    # the stage sat idle, within one period's 10 ms slice, so the quota does not slow it
    delay = np.array([[0.0, 50.0], [50.0, 0.0]])
    rate = np.full((2, 2), 1e9)
    traffic = StepTraffic((1000.0,), activation_bytes=0.0, micro_batches=1)
    compute = uniform(2, 1, 0.004, 0.004)
    free = simulated_step_s(delay, rate, [[0], [1]], traffic, compute)
    averaging = group_averaging_s(delay / 1e3, rate * 1e9, [0, 1], 1000.0)
    assert free == pytest.approx(0.008 + averaging)
    limited = simulated_step_s(delay, rate, [[0], [1]], traffic, quota(compute, 0.25, 0.04))
    assert limited == pytest.approx(free)
    # the same CPU as one fluid quarter core (every piece at CPU / 0.25) would be 24 ms slower
    assert limited < 0.008 / 0.25 + averaging - 0.02
