"""Unequal stages (schedule/split.py): the layer split that makes a placement's slowest stage
fastest, and the plans that carry it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest

from p2ptrain.schedule import Topology, Workload, plan_swarm
from p2ptrain.schedule.compute import PeerCompute
from p2ptrain.schedule.cost import CostModel, plan_cost
from p2ptrain.schedule.shapes import candidate_shapes, plan_best_shape, scaled_workload
from p2ptrain.schedule.split import balanced_layers, split_plan, stage_times


def compute_of(block_row_s: Sequence[float], n_layer: int) -> PeerCompute:
    block = np.array(block_row_s, dtype=float)
    return PeerCompute(block, block / 4, block / 2, n_layer, 16, 2)


def compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every split of `total` blocks into `parts` stages of at least one."""
    return [
        tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))
        for cuts in itertools.combinations(range(1, total), parts - 1)
    ]


def test_half_the_peers_four_times_slower_give_their_stage_fewer_layers() -> None:
    # 4 peers, 2 x 2, n_layer 8: the slow peers (1 and 3) both hold stage 1
    compute = compute_of([1e-3, 4e-3, 1e-3, 4e-3], n_layer=8)
    pipelines = np.array([[0, 1], [2, 3]])
    layers = balanced_layers(compute, pipelines)
    assert len(layers) == 2 and sum(layers) == 8 and min(layers) >= 1
    assert layers[1] < layers[0]  # the slow stage gets fewer layers
    even = max(stage_times(compute, pipelines, (4, 4)))
    best = max(stage_times(compute, pipelines, layers))
    assert best < 0.6 * even  # the predicted slowest stage falls
    # ... and no composition does better
    assert best == pytest.approx(
        min(max(stage_times(compute, pipelines, c)) for c in compositions(8, 2))
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_split_is_the_best_composition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    stages, replicas = int(rng.integers(1, 5)), int(rng.integers(1, 3))
    n_layer = int(rng.integers(stages, 10))
    compute = compute_of(rng.uniform(1e-3, 8e-3, stages * replicas), n_layer)
    pipelines = rng.permutation(stages * replicas).reshape(replicas, stages)
    layers = balanced_layers(compute, pipelines)
    chosen = layers or compute.layers_or_even(stages)
    assert len(chosen) == stages and sum(chosen) == n_layer and min(chosen) >= 1
    best = min(max(stage_times(compute, pipelines, c)) for c in compositions(n_layer, stages))
    assert max(stage_times(compute, pipelines, chosen)) == pytest.approx(best, rel=1e-12)
    assert balanced_layers(compute, pipelines) == layers  # deterministic


def test_equal_peers_keep_the_even_cut() -> None:
    compute = PeerCompute(np.full(4, 1e-3), np.zeros(4), np.zeros(4), 8, 16, 2)
    assert balanced_layers(compute, np.array([[0, 1], [2, 3]])) == ()
    with pytest.raises(ValueError):
        compute.stage_table(2, 2, (3, 3))  # 6 of 8 layers


def uniform(num_peers: int, work: Workload, compute: PeerCompute | None) -> Topology:
    """Equal links: only compute tells placements apart (the search's secondary score, the sum
    of each stage's slowest time, then puts the slow peers on one stage)."""
    delay, rate = np.full((num_peers, num_peers), 5.0), np.full((num_peers, num_peers), 1.0)
    peers = [f"p{i}" for i in range(num_peers)]
    return Topology(peers, delay, rate, workload=work, compute=compute)


def test_a_plan_carries_the_split_and_is_priced_with_it() -> None:
    work = Workload(2, 2, 0.01, 0.01)
    compute = compute_of([1e-3, 4e-3, 1e-3, 4e-3], n_layer=8)
    topology = uniform(4, work, compute)
    even = plan_swarm(topology, seed=0)
    assert {row[1] for row in even.pipelines} in ({1, 3}, {0, 2})  # the slow ones share a stage
    plan = split_plan(topology, even, scaled_workload(work))
    assert plan.stage_layers and sum(plan.stage_layers) == 8
    assert plan.cost_s < even.cost_s and plan.compute_cost_s < even.compute_cost_s
    workload = scaled_workload(work)(2, 2, plan.stage_layers)
    assert workload.c_dp_gb > work.c_dp_gb  # the bigger stage sends bigger gradients
    model = CostModel.build(topology, workload, plan.stage_layers)
    assert plan.cost_s == pytest.approx(plan_cost(model, np.array(plan.pipelines)).cost_s)
    # the same inputs give the same plan; the compute-blind topology keeps the even cut
    again = split_plan(topology, plan_swarm(topology, seed=0), scaled_workload(work))
    assert (again.pipelines, again.stage_layers, again.cost_s) == (
        plan.pipelines,
        plan.stage_layers,
        plan.cost_s,
    )
    blind = uniform(4, work, None)
    assert split_plan(blind, plan_swarm(blind, seed=0), scaled_workload(work)).stage_layers == []


def test_the_shape_search_prices_uneven_stage_counts_and_splits() -> None:
    assert [s for s, _ in candidate_shapes(12, 4, 12)] == [4, 3, 2, 1]
    assert [s for s, _ in candidate_shapes(64, 16, 16)] == [16, *range(8, 0, -1)]
    work = Workload(2, 2, 0.01, 0.01)
    topology = uniform(4, work, compute_of([1e-3, 4e-3, 1e-3, 4e-3], n_layer=8))
    best = plan_best_shape(topology, [(2, 2)], scaled_workload(work), seed=0)
    assert best.stage_layers and best.to_json()["stage_layers"] == best.stage_layers
