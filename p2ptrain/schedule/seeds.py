"""Starting plans built from the link costs alone (deterministic, no randomness needed).

Slow links dominate: a good plan keeps each pipeline's neighbours close (pipeline traffic crosses a
boundary on every micro-batch) and lets data-parallel groups span the distance. These seeds encode
the two shapes: pipelines of mutually close peers, or data-parallel groups of mutually close peers.
"""

from __future__ import annotations

import numpy as np

from p2ptrain.schedule.cost import CostModel, FloatArray, IntArray, partition_cost


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
        chosen = np.concatenate([[idx[anchor]], idx[members]]) if size > 1 else np.array([idx[anchor]])
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


def random_plan(model: CostModel, rng: np.random.Generator) -> IntArray:
    chosen = rng.permutation(model.num_peers)[: model.stages * model.replicas]
    return chosen.reshape(model.replicas, model.stages)
