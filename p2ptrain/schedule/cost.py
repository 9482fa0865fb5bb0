"""The paper's communication cost model, COMM = DATAP + 2 * PIPEP, in the authors' units, plus
(beyond the paper) a compute term when peers' stage times were measured (compute.py).

Two entry points:
- ``partition_cost``: a partition into data-parallel groups; the pipeline order of the groups and the
  matchings between neighbouring groups are solved exactly (bottleneck matching + open-loop TSP).
- ``plan_cost``: an explicit plan (R pipelines of S peers); nothing is solved.
Units follow the authors' code so their numbers reproduce: delay in ms, bandwidth in Gbit/s, sizes in
GB (x8 gives Gbit), cost in seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from p2ptrain.schedule.topology import Topology, Workload

IntArray = npt.NDArray[np.intp]
FloatArray = npt.NDArray[np.float64]

# Beyond this many stages the exact open-loop TSP (Held–Karp, O(2^S S^2)) is replaced by a heuristic.
MAX_EXACT_TSP_STAGES = 16


@dataclass(frozen=True)
class CostModel:
    """Per-pair costs of one topology under one workload, precomputed for fast evaluation.

    dp_pair[a, b]: what device a pays to exchange its share of gradients with b, both ways:
        2 * (delay + c_dp / (R * bandwidth)), per step: divided by the workload's
        steps_per_sync (DiLoCo's H: one exchange spread over H steps); zero on the diagonal.
    pp_pair[a, b]: time to send one replica's activations from a to b: delay + c_pp / bandwidth.
    stage_s[p, j]: one micro-batch of stage j on peer p, forward + backward (compute.py); None
        without measured compute, which leaves the paper's cost exactly as it was.
    slots: micro-batch slots of a GPipe step (M + S - 1); the compute term is
        slots * max over the plan's positions of stage_s.
    """

    stages: int
    replicas: int
    dp_pair: FloatArray
    pp_pair: FloatArray
    stage_s: FloatArray | None = None
    slots: int = 0

    @classmethod
    def build(cls, topology: Topology, workload: Workload, layers: Sequence[int] = ()) -> CostModel:
        """`layers`: blocks per stage for the compute term (empty: the model's even cut)."""
        topology.check_fits(workload.stages, workload.replicas)
        delay_s = topology.delay_ms / 1e3
        gbits = topology.bandwidth_gbps
        num_peers = topology.num_peers
        off_diag = ~np.eye(num_peers, dtype=bool)
        safe_bw = np.where(off_diag, gbits, 1.0)
        exchange = 2 * (delay_s + workload.c_dp_gb * 8 / (safe_bw * workload.replicas))
        dp_pair = np.where(off_diag, exchange / workload.steps_per_sync, 0.0)
        pp_pair = np.where(off_diag, delay_s + workload.c_pp_gb * 8 / safe_bw, 0.0)
        compute = topology.compute
        if compute is None:
            return cls(workload.stages, workload.replicas, dp_pair, pp_pair)
        stage_s = compute.stage_table(workload.stages, workload.replicas, layers)
        slots = compute.pipeline_slots(workload.stages)
        return cls(workload.stages, workload.replicas, dp_pair, pp_pair, stage_s, slots)

    def reordered(self, order: IntArray) -> CostModel:
        """The same model with peer i of the result being peer order[i] of this one."""
        ix = np.ix_(order, order)
        stage_s = None if self.stage_s is None else self.stage_s[order]
        return CostModel(
            self.stages, self.replicas, self.dp_pair[ix], self.pp_pair[ix], stage_s, self.slots
        )

    def compute_cost(self, pipelines: IntArray) -> float:
        """slots x the slowest stage time over the plan's positions (0 without compute)."""
        if self.stage_s is None:
            return 0.0
        return float(self.slots * self.stage_s[pipelines, np.arange(pipelines.shape[1])].max())

    @property
    def num_peers(self) -> int:
        return int(self.dp_pair.shape[0])


@dataclass(frozen=True)
class Evaluation:
    """The cost of a plan and the plan itself (pipelines[i][j]: peer at stage j of replica i)."""

    cost_s: float
    dp_cost_s: float
    pp_cost_s: float  # already x2 (activations forward + gradients backward)
    pipelines: IntArray  # (R, S)
    compute_cost_s: float = 0.0  # (M + S - 1) x the slowest stage; 0 without measured compute


# ---------------------------------------------------------------------------------------------
# data-parallel cost


def dp_group_costs(model: CostModel, groups: IntArray) -> FloatArray:
    """DP(C_j) for each group (row of ``groups``, shape (S, R)): the slowest member's total."""
    block = model.dp_pair[groups[:, :, None], groups[:, None, :]]  # (S, R, R)
    return np.asarray(block.sum(axis=2).max(axis=1), dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# bottleneck perfect matching


def bottleneck_matching(cost: FloatArray) -> tuple[float, IntArray]:
    """min over perfect matchings of the largest matched cost, and a matching reaching it.

    Threshold search: a perfect matching using only entries <= t exists iff the 0/1 assignment
    problem on (cost > t) has optimum 0. Every row and every column needs some entry, so the
    answer is at least the largest row- or column-minimum; it is often exactly that.
    Returns (value, cols) with row i matched to column cols[i].
    """
    size = cost.shape[0]
    if size == 1:
        return float(cost[0, 0]), np.zeros(1, dtype=np.intp)
    lower = max(cost.min(axis=1).max(), cost.min(axis=0).max())
    cols = _matching_under(cost, lower)
    if cols is not None:
        return float(lower), cols
    candidates = np.unique(cost[cost > lower])
    lo, hi = 0, len(candidates) - 1  # candidates[hi] is the largest entry: always feasible
    best = _matching_under(cost, candidates[hi])
    assert best is not None
    while lo < hi:
        mid = (lo + hi) // 2
        found = _matching_under(cost, candidates[mid])
        if found is None:
            lo = mid + 1
        else:
            hi, best = mid, found
    return float(candidates[hi]), best


def _matching_under(cost: FloatArray, threshold: float) -> IntArray | None:
    # scipy (~40 MiB) loads on the first search only: a planner's control process prices plans
    # (plan_cost, nothing solved) but its searches run in a child (control/planning/search_process)
    from scipy.optimize import linear_sum_assignment

    over = (cost > threshold).astype(np.float64)
    rows, cols = linear_sum_assignment(over)
    if over[rows, cols].sum() > 0:
        return None
    return np.asarray(cols, dtype=np.intp)


def group_link_weights(model: CostModel, groups: IntArray) -> FloatArray:
    """Symmetric (S, S) matrix of bottleneck matching values between every pair of groups."""
    num_groups = groups.shape[0]
    weights = np.zeros((num_groups, num_groups))
    for a in range(num_groups):
        rows = model.pp_pair[groups[a]]
        for b in range(a + 1, num_groups):
            value, _ = bottleneck_matching(rows[:, groups[b]])
            weights[a, b] = weights[b, a] = value
    return weights


# ---------------------------------------------------------------------------------------------
# open-loop TSP (cheapest Hamiltonian path, any start)


@lru_cache(maxsize=32)
def _held_karp_tables(num_nodes: int) -> list[tuple[IntArray, IntArray, IntArray]]:
    """For each subset size k >= 2: (masks, last, prev_mask) for every (subset, last node in it)."""
    layers = []
    for size in range(2, num_nodes + 1):
        masks, last, prev = [], [], []
        for combo in itertools.combinations(range(num_nodes), size):
            mask = sum(1 << c for c in combo)
            for node in combo:
                masks.append(mask)
                last.append(node)
                prev.append(mask ^ (1 << node))
        layers.append(
            (
                np.array(masks, dtype=np.intp),
                np.array(last, dtype=np.intp),
                np.array(prev, dtype=np.intp),
            )
        )
    return layers


def open_path_cost(weights: FloatArray) -> float:
    """Cost of the cheapest path visiting every node once (exact up to MAX_EXACT_TSP_STAGES)."""
    return open_path(weights)[0]


def open_path(weights: FloatArray) -> tuple[float, IntArray]:
    """The cheapest Hamiltonian path over a symmetric weight matrix and its node order."""
    num_nodes = weights.shape[0]
    if num_nodes == 1:
        return 0.0, np.zeros(1, dtype=np.intp)
    if num_nodes > MAX_EXACT_TSP_STAGES:
        return _open_path_heuristic(weights)
    # dp[mask, j]: cheapest path over the nodes of mask that ends at j.
    dp = np.full((1 << num_nodes, num_nodes), np.inf)
    parent = np.full((1 << num_nodes, num_nodes), -1, dtype=np.intp)
    singles = 1 << np.arange(num_nodes)
    dp[singles, np.arange(num_nodes)] = 0.0
    for masks, last, prev in _held_karp_tables(num_nodes):
        # extend every path over prev ending at k by the edge k -> last
        options = dp[prev] + weights[:, last].T  # (M, S)
        best = options.argmin(axis=1)
        dp[masks, last] = options[np.arange(len(masks)), best]
        parent[masks, last] = best
    full = (1 << num_nodes) - 1
    end = int(dp[full].argmin())
    cost = float(dp[full, end])
    order = [end]
    mask = full
    while len(order) < num_nodes:
        prev_node = int(parent[mask, order[-1]])
        mask ^= 1 << order[-1]
        order.append(prev_node)
    return cost, np.array(order[::-1], dtype=np.intp)


def _path_length(weights: FloatArray, order: list[int]) -> float:
    return float(sum(weights[order[i], order[i + 1]] for i in range(len(order) - 1)))


def _open_path_heuristic(weights: FloatArray) -> tuple[float, IntArray]:
    """Nearest neighbour from every start, then 2-opt and or-opt until no move helps."""
    num_nodes = weights.shape[0]
    best_cost, best_order = np.inf, list(range(num_nodes))
    for start in range(num_nodes):
        order = [start]
        free = set(range(num_nodes)) - {start}
        while free:
            here = order[-1]
            nxt = min(free, key=lambda n: (weights[here, n], n))
            order.append(nxt)
            free.remove(nxt)
        order = _improve_path(weights, order)
        cost = _path_length(weights, order)
        if cost < best_cost - 1e-12:
            best_cost, best_order = cost, order
    return float(best_cost), np.array(best_order, dtype=np.intp)


def _improve_path(weights: FloatArray, order: list[int]) -> list[int]:
    improved = True
    n = len(order)
    while improved:
        improved = False
        # 2-opt on a path: reverse order[i:j+1]; edges at the ends may be absent.
        for i in range(n - 1):
            for j in range(i + 1, n):
                before = (weights[order[i - 1], order[i]] if i > 0 else 0.0) + (
                    weights[order[j], order[j + 1]] if j < n - 1 else 0.0
                )
                after = (weights[order[i - 1], order[j]] if i > 0 else 0.0) + (
                    weights[order[i], order[j + 1]] if j < n - 1 else 0.0
                )
                if after < before - 1e-12:
                    order[i : j + 1] = order[i : j + 1][::-1]
                    improved = True
        # or-opt: move one node elsewhere
        for i in range(n):
            node = order[i]
            rest = order[:i] + order[i + 1 :]
            current = _path_length(weights, order)
            for k in range(n):
                candidate = [*rest[:k], node, *rest[k:]]
                if _path_length(weights, candidate) < current - 1e-12:
                    order, improved = candidate, True
                    break
    return order


# ---------------------------------------------------------------------------------------------
# whole assignments


def partition_cost(model: CostModel, groups: IntArray) -> Evaluation:
    """Cost of a partition into S data-parallel groups of R peers, solving order and matchings."""
    groups = np.asarray(groups, dtype=np.intp)
    _check_shape(model, groups, (model.stages, model.replicas), "groups")
    dp_cost = float(dp_group_costs(model, groups).max())
    weights = group_link_weights(model, groups)
    pp_cost, order = open_path(weights)
    pipelines = chain_pipelines(model, groups, order)
    compute = model.compute_cost(pipelines)
    return Evaluation(dp_cost + 2 * pp_cost + compute, dp_cost, 2 * pp_cost, pipelines, compute)


def chain_pipelines(model: CostModel, groups: IntArray, order: IntArray) -> IntArray:
    """Pipelines (R, S) from the group order and bottleneck matchings between neighbours."""
    num_groups, replicas = groups.shape
    pipelines = np.empty((replicas, num_groups), dtype=np.intp)
    pipelines[:, 0] = groups[order[0]]
    for stage in range(1, num_groups):
        nxt = groups[order[stage]]
        _, cols = bottleneck_matching(model.pp_pair[pipelines[:, stage - 1]][:, nxt])
        pipelines[:, stage] = nxt[cols]
    return pipelines


def plan_cost(model: CostModel, pipelines: IntArray) -> Evaluation:
    """Cost of an explicit plan: DP over its stage groups + 2 x the sum of boundary bottlenecks."""
    pipelines = np.asarray(pipelines, dtype=np.intp)
    _check_shape(model, pipelines, (model.replicas, model.stages), "pipelines")
    dp_cost = float(dp_group_costs(model, pipelines.T).max())
    if model.stages > 1:
        links = model.pp_pair[pipelines[:, :-1], pipelines[:, 1:]]  # (R, S-1)
        pp_cost = float(links.max(axis=0).sum())
    else:
        pp_cost = 0.0
    compute = model.compute_cost(pipelines)
    return Evaluation(dp_cost + 2 * pp_cost + compute, dp_cost, 2 * pp_cost, pipelines, compute)


def _check_shape(model: CostModel, value: IntArray, shape: tuple[int, int], what: str) -> None:
    if value.shape != shape:
        raise ValueError(f"{what} must have shape {shape}, got {value.shape}")
    flat = value.ravel()
    if flat.min() < 0 or flat.max() >= model.num_peers:
        raise ValueError(f"{what} names a peer outside 0..{model.num_peers - 1}")
    if len(np.unique(flat)) != len(flat):
        raise ValueError(f"{what} uses a peer more than once")
