import itertools

import numpy as np
import pytest

from p2ptrain.harness.scheduler_bench import AUTHORS_COST_S
from p2ptrain.schedule import Topology, Workload, load_topology, scenario_path
from p2ptrain.schedule.cost import (
    CostModel,
    bottleneck_matching,
    open_path,
    partition_cost,
    plan_cost,
)
from tests.schedule.reference import naive_partition_cost


def random_topology(num_peers: int, seed: int, workload: Workload | None = None) -> Topology:
    rng = np.random.default_rng(seed)
    delay = rng.uniform(1, 150, size=(num_peers, num_peers))
    bandwidth = rng.uniform(0.2, 5, size=(num_peers, num_peers))
    delay = (delay + delay.T) / 2
    bandwidth = (bandwidth + bandwidth.T) / 2
    return Topology([f"p{i}" for i in range(num_peers)], delay, bandwidth, workload=workload)


def test_hand_computed_cost_of_four_peers() -> None:
    # peers 0,1 in one city (10 ms, 1 Gbit/s), 2,3 in another; 50 ms, 0.5 Gbit/s across.
    delay = np.array([[0, 10, 50, 50], [10, 0, 50, 50], [50, 50, 0, 10], [50, 50, 10, 0]], float)
    bw = np.array([[1, 1, 0.5, 0.5], [1, 1, 0.5, 0.5], [0.5, 0.5, 1, 1], [0.5, 0.5, 1, 1]], float)
    work = Workload(stages=2, replicas=2, c_dp_gb=1.0, c_pp_gb=0.25)
    model = CostModel.build(Topology(["a", "b", "c", "d"], delay, bw, workload=work), work)
    # groups {0,2},{1,3}: DP = 2*(0.05 + 1*8/(0.5*2)) = 16.1; pipeline: match 0-1, 2-3 at
    # 0.01 + 0.25*8/1 = 2.01, x2 = 4.02; total 20.12
    e = partition_cost(model, np.array([[0, 2], [1, 3]]))
    assert e.dp_cost_s == pytest.approx(16.1)
    assert e.pp_cost_s == pytest.approx(4.02)
    assert e.cost_s == pytest.approx(20.12)
    # groups {0,1},{2,3}: DP = 2*(0.01 + 8/(1*2)) = 8.02; pipeline 0.05 + 2/0.5 = 4.05, x2 = 8.1
    e = partition_cost(model, np.array([[0, 1], [2, 3]]))
    assert e.cost_s == pytest.approx(8.02 + 8.1)
    assert plan_cost(model, e.pipelines).cost_s == pytest.approx(e.cost_s)


@pytest.mark.parametrize("name", sorted(AUTHORS_COST_S))
def test_authors_numbers_reproduced_on_their_plans(name: str) -> None:
    """The partition the authors' scheduler converged to (one peer of each block of 8 per
    data-parallel group) costs exactly what their code printed."""
    topology = load_topology(scenario_path(name))
    assert topology.workload is not None
    model = CostModel.build(topology, topology.workload)
    groups = np.arange(64).reshape(8, 8).T.copy()
    assert partition_cost(model, groups).cost_s == pytest.approx(AUTHORS_COST_S[name], abs=5e-5)


@pytest.mark.parametrize("name", sorted(AUTHORS_COST_S))
def test_fast_cost_matches_naive_on_random_partitions(name: str) -> None:
    topology = load_topology(scenario_path(name))
    w = topology.workload
    assert w is not None
    model = CostModel.build(topology, Workload(4, 4, w.c_dp_gb, w.c_pp_gb))
    rng = np.random.default_rng(7)
    for _ in range(3):
        groups = rng.permutation(64)[:16].reshape(4, 4)
        fast = partition_cost(model, groups).cost_s
        slow = naive_partition_cost(
            topology.delay_ms, topology.bandwidth_gbps, groups.tolist(), w.c_dp_gb, w.c_pp_gb
        )
        assert fast == pytest.approx(slow, rel=1e-9)


def test_partition_cost_equals_cost_of_its_pipelines() -> None:
    topology = random_topology(24, seed=3)
    model = CostModel.build(topology, Workload(4, 6, 0.5, 0.3))
    groups = np.random.default_rng(0).permutation(24).reshape(4, 6)
    e = partition_cost(model, groups)
    assert plan_cost(model, e.pipelines).cost_s == pytest.approx(e.cost_s, rel=1e-12)
    assert sorted(e.pipelines.ravel().tolist()) == list(range(24))
    # every stage column is one of the given groups
    assert sorted(sorted(col) for col in e.pipelines.T.tolist()) == sorted(
        sorted(g) for g in groups.tolist()
    )


@pytest.mark.parametrize("size", [1, 2, 3, 5, 6])
def test_bottleneck_matching_is_optimal(size: int) -> None:
    rng = np.random.default_rng(size)
    for _ in range(20):
        cost = rng.integers(0, 6, size=(size, size)).astype(float)  # many ties
        best = min(
            max(cost[i, p[i]] for i in range(size)) for p in itertools.permutations(range(size))
        )
        value, cols = bottleneck_matching(cost)
        assert value == best
        assert sorted(cols.tolist()) == list(range(size))
        assert max(cost[i, cols[i]] for i in range(size)) == value


@pytest.mark.parametrize("num_nodes", [1, 2, 3, 5, 7])
def test_held_karp_matches_brute_force(num_nodes: int) -> None:
    rng = np.random.default_rng(num_nodes)
    w = rng.uniform(0, 10, size=(num_nodes, num_nodes))
    w = (w + w.T) / 2
    best = min(
        sum(w[o[i], o[i + 1]] for i in range(num_nodes - 1))
        for o in itertools.permutations(range(num_nodes))
    )
    cost, order = open_path(w)
    assert cost == pytest.approx(best)
    assert sorted(order.tolist()) == list(range(num_nodes))
    assert sum(w[order[i], order[i + 1]] for i in range(num_nodes - 1)) == pytest.approx(cost)


def test_heuristic_path_beyond_exact_limit_is_valid_and_good() -> None:
    # points on a line, shuffled: the best path walks the line, length = span
    rng = np.random.default_rng(0)
    xs = rng.permutation(np.arange(20, dtype=float))
    w = np.abs(xs[:, None] - xs[None, :])
    cost, order = open_path(w)
    assert sorted(order.tolist()) == list(range(20))
    assert cost == pytest.approx(19.0)
