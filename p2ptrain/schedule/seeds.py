"""Starting plans built from the link costs alone (deterministic, no randomness needed).

Slow links dominate: a good plan keeps each pipeline's neighbours close (pipeline traffic crosses a
boundary on every micro-batch) and lets data-parallel groups span the distance. These seeds encode
the two shapes: pipelines of mutually close peers, or data-parallel groups of mutually close peers.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from p2ptrain.schedule.cost import (
    CostModel,
    FloatArray,
    IntArray,
    bottleneck_matching,
    dp_group_costs,
    open_path,
    partition_cost,
)


def tight_clusters(pair_cost: FloatArray, num_clusters: int, size: int) -> IntArray:
    """Greedy balanced clustering: repeatedly take the peer whose size-1 nearest free peers are
    cheapest, with those peers. Peers left over (N > clusters x size) are not used."""
    num_peers = pair_cost.shape[0]
    free = np.ones(num_peers, dtype=bool)
    clusters = np.empty((num_clusters, size), dtype=np.intp)
    cost = pair_cost + np.diag(np.full(num_peers, np.inf))
    for c in range(num_clusters):
        idx = np.flatnonzero(free)
        sub = cost[np.ix_(idx, idx)]
        if size > 1:
            nearest = np.partition(sub, size - 2, axis=1)[:, : size - 1]
            spread = nearest.sum(axis=1)
        else:
            spread = np.zeros(len(idx))
        anchor = int(spread.argmin())
        members = np.argsort(sub[anchor], kind="stable")[: size - 1]
        chosen = (
            np.concatenate([[idx[anchor]], idx[members]]) if size > 1 else np.array([idx[anchor]])
        )
        clusters[c] = chosen
        free[chosen] = False
    return clusters


def pipelines_seed(model: CostModel) -> IntArray:
    """Each pipeline made of mutually close peers (by activation-transfer cost)."""
    return tight_clusters(model.pp_pair, model.replicas, model.stages)


def groups_seed(model: CostModel) -> IntArray:
    """Each data-parallel group made of mutually close peers, order and matchings solved exactly."""
    groups = tight_clusters(model.dp_pair, model.stages, model.replicas)
    return partition_cost(model, groups).pipelines


def nearest_neighbour_path(pair_cost: FloatArray, start: int) -> IntArray:
    """Peers in greedy nearest-neighbour order from ``start``: close peers end up adjacent."""
    num_peers = pair_cost.shape[0]
    visited = np.zeros(num_peers, dtype=bool)
    order = np.empty(num_peers, dtype=np.intp)
    here = start
    for i in range(num_peers):
        order[i] = here
        visited[here] = True
        if i + 1 < num_peers:
            row = np.where(visited, np.inf, pair_cost[here])
            here = int(row.argmin())
    return order


def cluster_path_orders(pair_cost: FloatArray, cluster_counts: tuple[int, ...]) -> list[IntArray]:
    """1-D orders of the peers in which close peers sit together and close clusters are adjacent.

    Average-linkage clustering at several granularities; the clusters are chained by the cheapest
    open path over their mean costs (the scheduler's own TSP), peers within a cluster by
    nearest-neighbour order.
    """
    num_peers = pair_cost.shape[0]
    sym = (pair_cost + pair_cost.T) / 2
    np.fill_diagonal(sym, 0.0)
    tree = linkage(squareform(sym, checks=False), method="average")
    orders = []
    for count in cluster_counts:
        if count > num_peers:
            continue
        labels = fcluster(tree, t=count, criterion="maxclust") - 1
        names = np.unique(labels)
        members = [np.flatnonzero(labels == c) for c in names]
        between = np.array([[sym[np.ix_(a, b)].mean() for b in members] for a in members])
        _, cluster_order = open_path(between)
        chunks = []
        for c in cluster_order:
            inside = members[int(c)]
            local = nearest_neighbour_path(sym[np.ix_(inside, inside)], 0)
            chunks.append(inside[local])
        orders.append(np.concatenate(chunks))
    return orders


def path_groups_seeds(model: CostModel) -> list[IntArray]:
    """Data-parallel groups cut as consecutive blocks of 1-D peer orders (cluster paths).

    Each group then spans one or two neighbouring clusters (cheap DP), and neighbouring blocks
    share clusters (cheap pipeline boundaries). The cheapest cut is first.
    """
    counts = tuple(sorted({4, 8, model.stages, 2 * model.stages, 32}))
    num_planned = model.stages * model.replicas
    plans = []
    for order in cluster_path_orders(model.pp_pair, counts):
        for direction in (order, order[::-1]):  # which end the spares come from
            groups = direction[:num_planned].reshape(model.stages, model.replicas)
            plans.append(partition_cost(model, groups))
            if num_planned == model.num_peers:
                break
    plans.sort(key=lambda e: e.cost_s)
    return [e.pipelines for e in plans]


def random_plan(model: CostModel, rng: np.random.Generator) -> IntArray:
    chosen = rng.permutation(model.num_peers)[: model.stages * model.replicas]
    return chosen.reshape(model.replicas, model.stages)


def _chunks(model: CostModel, piece: int) -> list[IntArray]:
    """Peers cut into chunks of close peers: each cluster, split into a part that fills whole
    data-parallel groups and a remainder that will have to share a group."""
    pair = (model.pp_pair + model.pp_pair.T) / 2
    np.fill_diagonal(pair, 0.0)
    labels = fcluster(
        linkage(squareform(pair, checks=False), method="average"),
        t=min(32, model.num_peers),
        criterion="maxclust",
    )
    chunks = []
    for label in np.unique(labels):
        inside = np.flatnonzero(labels == label)
        inside = inside[nearest_neighbour_path(pair[np.ix_(inside, inside)], 0)]
        chunks += [inside[i : i + piece] for i in range(0, len(inside), piece)]
    return chunks


def _chain_cost(model: CostModel, order: IntArray) -> tuple[float, float]:
    """Cost of cutting a 1-D order into consecutive groups chained in that order, and the sum of
    all groups' DP costs as a tie-breaker (the max alone leaves long plateaus)."""
    num_planned = model.stages * model.replicas
    groups = order[:num_planned].reshape(model.stages, model.replicas)
    dp = dp_group_costs(model, groups)
    pp = 0.0
    for a, b in itertools.pairwise(groups):
        value, _ = bottleneck_matching(model.pp_pair[np.ix_(a, b)])
        pp += value
    return float(dp.max() + 2 * pp), float(dp.sum() + 2 * pp)


def chunk_order_seed(
    model: CostModel, rng: np.random.Generator, num_steps: int, deadline: float, piece: int
) -> IntArray:
    """Search the order of cluster chunks (swap, move and reverse moves, ties accepted) so that
    groups cut from it straddle only cheap cluster boundaries; returns the best plan."""
    chunks = _chunks(model, piece)
    order = list(range(len(chunks)))
    flip = [False] * len(chunks)

    def sequence(order: list[int], flip: list[bool]) -> IntArray:
        return np.concatenate([chunks[c][::-1] if flip[c] else chunks[c] for c in order])

    best = _chain_cost(model, sequence(order, flip))
    for _ in range(num_steps):
        if time.perf_counter() >= deadline or len(chunks) < 2:
            break
        new_order, new_flip = order.copy(), flip.copy()
        kind = rng.integers(3)
        i, j = sorted(rng.choice(len(chunks), size=2, replace=False).tolist())
        if kind == 0:
            new_order[i], new_order[j] = new_order[j], new_order[i]
        elif kind == 1:
            new_order.insert(j, new_order.pop(i))
        else:
            new_order[i : j + 1] = new_order[i : j + 1][::-1]
            for c in new_order[i : j + 1]:
                new_flip[c] = not new_flip[c]
        cost = _chain_cost(model, sequence(new_order, new_flip))
        if cost[0] < best[0] - 1e-9 or (cost[0] <= best[0] + 1e-9 and cost[1] <= best[1] + 1e-9):
            best, order, flip = cost, new_order, new_flip
    num_planned = model.stages * model.replicas
    groups = sequence(order, flip)[:num_planned].reshape(model.stages, model.replicas)
    return partition_cost(model, groups).pipelines
