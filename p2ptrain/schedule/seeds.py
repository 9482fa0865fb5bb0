"""Starting plans built from the link costs alone (deterministic, no randomness needed; the
search's random starts are schedule/baselines.py's random_pipelines).

Slow links dominate: a good plan keeps each pipeline's neighbours close (pipeline traffic crosses a
boundary on every micro-batch) and lets data-parallel groups span the distance. These seeds encode
the two shapes: pipelines of mutually close peers, or data-parallel groups of mutually close peers.
"""

from __future__ import annotations

import numpy as np

from p2ptrain.schedule.cost import (
    CostModel,
    FloatArray,
    IntArray,
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
    if num_peers < 2:
        return [np.arange(num_peers, dtype=np.intp)]
    sym = (pair_cost + pair_cost.T) / 2
    np.fill_diagonal(sym, 0.0)
    from scipy.cluster.hierarchy import fcluster, linkage  # in searches only, as cost.py's
    from scipy.spatial.distance import squareform

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
