"""The step-time model (schedule/step_time.py) on cases small enough to compute by hand."""

from __future__ import annotations

import numpy as np
import pytest

from p2ptrain.schedule.step_time import (
    MAX_PART_BYTES,
    StepTraffic,
    group_averaging_s,
    part_size_bytes,
    pass_time_s,
    step_time,
)

MBIT = 1e6 / 1e9  # 1 Mbit/s in the topology's Gbit/s


def test_one_boundary_one_micro_batch() -> None:
    # 100 ms one way, 8 Mbit/s, 100 kB: delivery 0.1 + transfer 0.1
    traffic = StepTraffic((0.0, 0.0), activation_bytes=100_000, micro_batches=1)
    assert pass_time_s([0.1], [8e6], traffic) == pytest.approx(0.2)


def test_micro_batches_overlap_behind_the_slowest_boundary() -> None:
    # boundaries: (10 ms, 8 Mbit/s) and (50 ms, 4 Mbit/s); 4 micro-batches of 50 kB
    # latency 0.01 + 0.05; transfers 0.05 + 0.1; 3 more micro-batches x 0.1
    traffic = StepTraffic((0.0,) * 3, activation_bytes=50_000, micro_batches=4)
    assert pass_time_s([0.01, 0.05], [8e6, 4e6], traffic) == pytest.approx(0.06 + 0.15 + 0.3)


def test_a_single_stage_has_no_pipeline_time() -> None:
    assert pass_time_s([], [], StepTraffic((1.0,), 1.0, 2)) == 0.0


def test_group_of_two_averages_half_the_gradient_each_way() -> None:
    delay_s = np.array([[0.0, 0.1], [0.1, 0.0]])
    rate_bps = np.full((2, 2), 8e6)
    # metadata 0.1; 1 MB gradient, a share of 0.5 MB each in 4 parts: each link carries its
    # member's piece of the other share (0.5 s), then the 4 averaged parts of its own share
    # back (0.5 s; the first was reduced at 0.325 s, long before), plus 0.1 to arrive
    assert group_averaging_s(delay_s, rate_bps, [0, 1], 1_000_000) == pytest.approx(
        0.1 + 0.5 + 0.5 + 0.1
    )
    # the parts: a quarter of a share, hivemind's 512 KiB at most
    assert part_size_bytes(1_000_000, 2) == 125_000
    assert part_size_bytes(10e6, 2) == MAX_PART_BYTES
    assert part_size_bytes(6, 2, value_bytes=2) == 2  # never under one value
    assert group_averaging_s(delay_s, rate_bps, [1], 1_000_000) == 0.0


def test_group_of_three_is_bound_by_its_slowest_pair() -> None:
    delay_s = np.array([[0.0, 0.01, 0.2], [0.01, 0.0, 0.01], [0.2, 0.01, 0.0]])
    rate_bps = np.full((3, 3), 8e6)
    rate_bps[0, 2] = rate_bps[2, 0] = 4e6
    # metadata: peers 0 and 2 wait 0.2 for each other's; pair (0, 2): shares of 0.4 MB at
    # 4 Mbit/s, 0.8 s: the link carries the piece, then the averaged share back, plus 0.2
    assert group_averaging_s(delay_s, rate_bps, [0, 1, 2], 1_200_000) == pytest.approx(
        0.2 + 0.8 + 0.8 + 0.2
    )


def test_peers_outside_the_group_cost_nothing() -> None:
    # peers 0 and 1 are 1 ms apart; peer 2 (not in the group) is 100 ms from 1, 50 ms from 0:
    # no DHT matchmaking, so it plays no part (empty gradient: three one-way delays)
    delay_s = np.array([[0.0, 0.001, 0.05], [0.001, 0.0, 0.1], [0.05, 0.1, 0.0]])
    rate_bps = np.full((3, 3), 8e6)
    assert group_averaging_s(delay_s, rate_bps, [0, 1], 0.0) == pytest.approx(0.003)


def _two_cities() -> tuple[np.ndarray, np.ndarray]:
    # peers 0,1 in one city (5 ms, 40 Mbit/s); peers 2,3 in another; 50 ms, 10 Mbit/s between
    delay_ms = np.full((4, 4), 50.0)
    bandwidth = np.full((4, 4), 10 * MBIT)
    for city in ([0, 1], [2, 3]):
        for a in city:
            for b in city:
                delay_ms[a, b] = 0.0 if a == b else 5.0
                bandwidth[a, b] = 40 * MBIT
    return delay_ms, bandwidth


def test_step_time_of_two_by_two() -> None:
    delay_ms, bandwidth = _two_cities()
    traffic = StepTraffic((500_000.0, 250_000.0), activation_bytes=25_000, micro_batches=2)

    # pipelines inside a city, data-parallel groups across: [[0, 1], [2, 3]]
    across = step_time(delay_ms, bandwidth, [[0, 1], [2, 3]], traffic)
    # each way: 5 ms + 25 kB at 40 Mbit/s (5 ms) + 1 more micro-batch (5 ms) = 15 ms
    assert across.pipeline_s == pytest.approx(0.03)
    # stage 0 across: metadata 50 ms + 2 x 250 kB at 10 Mbit/s (0.2 s: the piece, then the
    # averaged share) + 50 ms; stage 1 across: the same with 125 kB shares (0.1 s)
    assert across.group_averaging_s == pytest.approx((0.5, 0.3))
    assert across.comm_s == pytest.approx(0.03 + 0.5)  # stage 0: the whole pipeline + its DP
    assert across.critical_stage == 0

    # pipelines across, groups inside a city: [[0, 2], [1, 3]]
    inside = step_time(delay_ms, bandwidth, [[0, 2], [1, 3]], traffic)
    # each way: 50 ms + 25 kB at 10 Mbit/s (20 ms) + 20 ms = 0.09
    assert inside.pipeline_s == pytest.approx(0.18)
    # stage 0 inside: metadata 5 ms + 2 x 250 kB at 40 Mbit/s (0.05 s) + 5 ms
    assert inside.group_averaging_s[0] == pytest.approx(0.005 + 0.1 + 0.005)
    assert inside.comm_s == pytest.approx(0.18 + 0.11)


def test_a_slow_last_group_can_be_the_critical_path() -> None:
    delay_ms, bandwidth = _two_cities()
    traffic = StepTraffic((0.0, 5_000_000.0), activation_bytes=25_000, micro_batches=2)
    result = step_time(delay_ms, bandwidth, [[0, 1], [2, 3]], traffic)
    # stage 1 across: metadata 50 ms + 2 x 2.5 MB at 10 Mbit/s (4 s, in 5 parts of 512 KiB
    # each way) + 50 ms; stage 0's path is the pipeline (0.03) + an empty all-reduce (0.15)
    assert result.critical_stage == 1
    assert result.comm_s == pytest.approx(4.1)
    assert result.averaging_s == pytest.approx(4.1)


def test_asymmetric_links_use_each_direction() -> None:
    delay_ms = np.array([[0.0, 10.0], [30.0, 0.0]])
    bandwidth = np.full((2, 2), 8 * MBIT)
    traffic = StepTraffic((0.0, 0.0), activation_bytes=10_000, micro_batches=1)
    result = step_time(delay_ms, bandwidth, [[0, 1]], traffic)
    # forward 0->1: 10 ms + 10 ms; backward 1->0: 30 ms + 10 ms; one replica: no averaging
    assert result.pipeline_s == pytest.approx(0.02 + 0.04)
    assert result.comm_s == pytest.approx(0.06)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="micro_batches"):
        StepTraffic((1.0,), 1.0, 0)
    with pytest.raises(ValueError, match="gradient sizes"):
        step_time(np.zeros((2, 2)), np.ones((2, 2)), [[0, 1]], StepTraffic((1.0,), 1.0, 1))
