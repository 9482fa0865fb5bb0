import numpy as np
import pytest

from p2ptrain.schedule import Topology, Workload, plan_swarm
from p2ptrain.schedule.compute import PeerCompute
from p2ptrain.schedule.cost import CostModel, partition_cost, plan_cost
from p2ptrain.schedule.local_search import apply_swap, best_swap_for, positions_of
from p2ptrain.schedule.plan_state import PlanState
from p2ptrain.schedule.search_budget import SearchStats
from p2ptrain.schedule.shapes import candidate_shapes, plan_best_shape, scaled_workload
from tests.schedule.test_cost import random_topology

NAN = float("nan")


def compute_of(
    block_row_s: list[float], n_layer: int = 8, batch: int = 16, mb: int = 2
) -> PeerCompute:
    block = np.array(block_row_s, dtype=float)
    return PeerCompute(block, block / 4, block / 2, n_layer, batch, mb)


def with_compute(topology: Topology, compute: PeerCompute, workload: Workload) -> Topology:
    return Topology(
        topology.peers,
        topology.delay_ms,
        topology.bandwidth_gbps,
        workload=workload,
        compute=compute,
    )


def test_stage_table_prices_layers_rows_and_the_ends() -> None:
    compute = PeerCompute(
        np.array([1.0, 2.0]), np.array([10.0, 20.0]), np.array([100.0, 200.0]), 5, 8, 2
    )
    table = compute.stage_table(stages=2, replicas=2)  # layers 3 + 2, 2 rows a micro-batch
    assert table.tolist() == [[2 * (3 + 10), 2 * (2 + 100)], [2 * (6 + 20), 2 * (4 + 200)]]
    assert compute.pipeline_slots(2) == 3


def test_unmeasured_peers_get_the_median_of_the_measured() -> None:
    compute = PeerCompute(
        np.array([1.0, NAN, 3.0, 5.0]),
        np.array([1.0, NAN, 1.0, 1.0]),
        np.array([0.0, NAN, 0.0, 0.0]),
        4,
        4,
        1,
    )
    assert compute.filled().block_row_s.tolist() == [1.0, 3.0, 3.0, 5.0]
    nothing = PeerCompute(np.full(3, NAN), np.full(3, NAN), np.full(3, NAN), 4, 4, 1)
    assert not nothing.filled().block_row_s.any()  # nothing measured: the paper's equal GPUs


def test_without_compute_the_cost_is_the_papers() -> None:
    work = Workload(2, 3, 0.4, 0.2)
    topology = random_topology(8, seed=1, workload=work)
    equal = with_compute(topology, compute_of([0.0] * 8), work)
    plan = np.arange(6).reshape(3, 2)
    blind = plan_cost(CostModel.build(topology, work), plan)
    zero = plan_cost(CostModel.build(equal, work), plan)
    assert blind.compute_cost_s == 0.0 and zero.cost_s == blind.cost_s


def test_compute_term_is_slots_times_the_slowest_stage() -> None:
    work = Workload(4, 2, 0.4, 0.2)
    block = [1.0] * 4 + [4.0] * 4
    topology = with_compute(random_topology(8, seed=2), compute_of(block), work)
    model = CostModel.build(topology, work)
    plan = np.arange(8).reshape(2, 4)  # pipeline 1 holds the slow peers
    evaluation = plan_cost(model, plan)
    # 8 layers in 4 stages, 16 rows / (2 replicas x 2 micro-batches); the last stage has the head
    slowest = 4 * (4.0 * 2 + 4.0 / 2)
    assert evaluation.compute_cost_s == pytest.approx((2 + 4 - 1) * slowest)
    assert evaluation.cost_s == pytest.approx(
        evaluation.dp_cost_s + evaluation.pp_cost_s + evaluation.compute_cost_s
    )
    groups = plan.T.copy()
    assert partition_cost(model, groups).cost_s == pytest.approx(
        plan_cost(model, partition_cost(model, groups).pipelines).cost_s
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_swap_scores_match_full_costs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    work = Workload(3, 3, 0.4, 0.2)
    block = rng.uniform(0.01, 0.1, size=11).tolist()
    topology = with_compute(random_topology(11, seed=seed), compute_of(block, n_layer=6), work)
    model = CostModel.build(topology, work)
    state = PlanState.of(model, rng.permutation(11)[:9].reshape(3, 3), SearchStats())
    for _ in range(20):
        pos = positions_of(state.plan, 11)
        peer = int(rng.choice(state.plan.ravel()))
        found = best_swap_for(state, peer, pos)
        if found is None:
            break
        cost, _, k, col = found
        apply_swap(state, (int(pos[peer][0]), int(pos[peer][1])), (k, col))
        assert state.cost == pytest.approx(cost, rel=1e-12)
        assert state.cost == pytest.approx(plan_cost(model, state.plan).cost_s, rel=1e-12)


def slow_half(num_peers: int, slow: list[int], factor: float = 4.0) -> PeerCompute:
    fast_s = 0.02  # per row per block: comparable to the links' seconds
    return compute_of([fast_s * (factor if p in slow else 1.0) for p in range(num_peers)])


def test_slow_peers_with_the_best_links_become_spares() -> None:
    # 12 peers for 4 x 2; the four slow ones sit on the best links, so a compute-blind plan
    # takes them, and a compute-aware one leaves them out
    work = Workload(4, 2, 0.4, 0.2)
    base = random_topology(12, seed=3)
    delay, bw = base.delay_ms.copy(), base.bandwidth_gbps.copy()
    slow = [0, 1, 2, 3]
    for p in slow:
        for q in slow:
            if p != q:
                delay[p, q], bw[p, q] = 0.1, 100.0
    links = Topology(base.peers, delay, bw, workload=work)
    aware = with_compute(links, slow_half(12, slow), work)
    blind_plan = plan_swarm(links, seed=0, time_budget_s=10)
    aware_plan = plan_swarm(aware, seed=0, time_budget_s=10)
    assert set(slow) & {p for row in blind_plan.pipelines for p in row}
    assert sorted(aware_plan.spares) == slow
    priced = CostModel.build(aware, work)
    blind_priced = plan_cost(priced, np.array(blind_plan.pipelines)).cost_s
    assert aware_plan.cost_s < blind_priced


def test_half_the_peers_four_times_slower_are_routed_around() -> None:
    # 8 peers, 4 of them 4x slower: the run's 4 x 2 must place every one of them; the shape
    # search leaves them out (fewer replicas or fewer stages, the slow peers spares)
    work = Workload(4, 2, 0.4, 0.2)
    slow = [1, 3, 4, 6]
    topology = with_compute(random_topology(8, seed=7, workload=work), slow_half(8, slow), work)
    blind_plan = plan_swarm(
        Topology(topology.peers, topology.delay_ms, topology.bandwidth_gbps, workload=work), seed=0
    )
    blind_priced = plan_cost(CostModel.build(topology, work), np.array(blind_plan.pipelines))
    assert topology.compute is not None
    shapes = candidate_shapes(8, 4, 8, topology.compute.block_row_s)
    assert shapes[0] == (4, 2) and (4, 1) in shapes and (2, 2) in shapes
    best = plan_best_shape(topology, shapes, scaled_workload(work), seed=0)
    assert sorted(best.spares) == slow
    assert best.cost_s < blind_priced.cost_s
    # the compute-aware search at the run's own shape prices the same placement no worse
    same_shape = plan_swarm(topology, seed=0)
    assert same_shape.cost_s <= blind_priced.cost_s + 1e-12


def test_timing_noise_among_equal_peers_offers_no_smaller_shape() -> None:
    # what 8 equal workers starting at once on 2 cores timed (ms per row and block): 3.6x apart,
    # the fastest in a quiet moment; no shape may leave any of them out
    noisy = np.array([11.8, 28.3, 42.6, 41.4, 30.9, 25.7, 33.9, 30.4]) / 1e3
    assert [shape for shape in candidate_shapes(8, 4, 8, noisy) if shape[0] == 4] == [(4, 2)]
    # four of them under a quarter-core quota (timed ~10x slower) are left out
    slowed = noisy.copy()
    slowed[[1, 3, 5, 7]] *= 10
    assert (4, 1) in candidate_shapes(8, 4, 8, slowed)


def two_regions(inter_delay_ms: float, inter_gbps: float) -> tuple[np.ndarray, np.ndarray]:
    """Peers 0-3 and 4-7 in two regions (5 ms, 1 Gbit/s inside), linked by the given link."""
    region = np.arange(8) // 4
    same = region[:, None] == region[None, :]
    delay = np.where(same, 5.0, inter_delay_ms)
    bandwidth = np.where(same, 1.0, inter_gbps)
    np.fill_diagonal(delay, 0.0)
    return delay, bandwidth


def shape_by_step_model(delay: np.ndarray, bandwidth: np.ndarray, block_row_s: float):
    from p2ptrain.records.run import RunSpec
    from p2ptrain.schedule.shapes import simulated_step_model
    from p2ptrain.schedule.workload import planning_workload, step_traffic

    run = RunSpec()  # 4 stages, 2 micro-batches, 16 rows: a ~0.8 MB gradient per stage
    compute = PeerCompute(
        np.full(8, block_row_s),
        np.full(8, block_row_s / 4),
        np.full(8, block_row_s / 2),
        run.model.n_layer,
        run.optim.batch_size,
        run.optim.micro_batches,
    )
    topology = Topology(
        [f"p{i}" for i in range(8)],
        delay,
        bandwidth,
        workload=planning_workload(run, 4, 2),
        compute=compute,
    )
    shapes = candidate_shapes(8, 4, run.model.n_layer, compute.block_row_s, fewer_replicas=True)
    assert shapes[:2] == [(4, 2), (4, 1)]  # equal peers: fewer replicas offered all the same
    model = simulated_step_model(lambda s, r, layers: step_traffic(run, s, r, layers), compute)
    return plan_best_shape(
        topology,
        [shape for shape in shapes if shape[0] == 4],
        lambda s, r, layers=(): planning_workload(run, s, r, layers),
        max_evaluations=2000,
        step_model=model,
    )


def test_the_step_model_keeps_one_pipeline_where_averaging_crosses_a_slow_ocean() -> None:
    # any second replica averages every stage over the 100 ms, 10 Mbit/s link: one pipeline
    # inside a region, the other region spare, runs the whole batch faster
    best = shape_by_step_model(*two_regions(100.0, 0.01), block_row_s=1e-3)
    assert best.replicas == 1
    assert {p // 4 for p in best.pipelines[0]} in ({0}, {1})


def test_the_step_model_keeps_every_replica_where_links_are_fast_and_compute_dominates() -> None:
    best = shape_by_step_model(*two_regions(5.0, 1.0), block_row_s=20e-3)
    assert best.replicas == 2
