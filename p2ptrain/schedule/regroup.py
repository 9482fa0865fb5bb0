"""Large-neighbourhood moves on the data-parallel groups: pool a few groups and deal them again.

Swapping one peer at a time cannot fix a group that holds a small minority of far-away peers (each
of them pays for every other member): the minority must leave together, and other groups must
absorb it in balance. This move takes the costliest group and one to three groups that share
clusters with it (or any one other group), pools their peers, sorts the pool by cluster and deals it
out again, round robin (every group gets its share of each cluster) or in contiguous blocks (pure
groups plus one remainder). The partition is re-costed exactly; the best improving move is kept.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from p2ptrain.schedule.cost import CostModel, Evaluation, IntArray, dp_group_costs, partition_cost
from p2ptrain.schedule.local_search import SearchStats

MAX_CLUSTERS = 32
_EPS = 1e-9

Dealer = Callable[[IntArray, int], list[IntArray]]


def cluster_labels(model: CostModel) -> IntArray:
    """Average-linkage clusters of peers by activation-transfer cost."""
    pair = (model.pp_pair + model.pp_pair.T) / 2
    np.fill_diagonal(pair, 0.0)
    if model.num_peers < 2:
        return np.zeros(model.num_peers, dtype=np.intp)
    tree = linkage(squareform(pair, checks=False), method="average")
    return np.asarray(
        fcluster(tree, t=min(MAX_CLUSTERS, model.num_peers), criterion="maxclust"), dtype=np.intp
    )


def _round_robin(pool: IntArray, count: int) -> list[IntArray]:
    return [pool[i::count] for i in range(count)]


def _blocks(pool: IntArray, count: int) -> list[IntArray]:
    size = len(pool) // count
    return [pool[i * size : (i + 1) * size] for i in range(count)]


DEALERS: tuple[Dealer, ...] = (_round_robin, _blocks)


def regroup(
    model: CostModel,
    pipelines: IntArray,
    labels: IntArray,
    deadline: float,
    stats: SearchStats,
    max_rounds: int = 50,
) -> Evaluation:
    """Improve a plan's partition by pool-and-deal moves; returns the best evaluation found."""
    groups = np.ascontiguousarray(pipelines.T)  # (S, R)
    current = partition_cost(model, groups)
    stats.evaluations += 1
    num_groups = groups.shape[0]
    if num_groups < 2:
        return current
    for _ in range(max_rounds):
        worst = int(dp_group_costs(model, groups).argmax())
        kinds = set(labels[groups[worst]].tolist())
        sharing = [
            g for g in range(num_groups) if g != worst and kinds & set(labels[groups[g]].tolist())
        ]
        candidates: list[tuple[int, ...]] = [(worst, g) for g in range(num_groups) if g != worst]
        candidates += [
            (worst, *c) for size in (2, 3) for c in itertools.combinations(sharing, size)
        ]
        best: tuple[Evaluation, IntArray] | None = None
        for members in candidates:
            pool = np.concatenate([groups[g] for g in members])
            pool = pool[np.argsort(labels[pool], kind="stable")]
            for dealer in DEALERS:
                trial = groups.copy()
                trial[list(members)] = np.stack(dealer(pool, len(members)))
                evaluation = partition_cost(model, trial)
                stats.evaluations += 1
                if evaluation.cost_s < (best[0] if best else current).cost_s - _EPS:
                    best = (evaluation, trial)
            if time.perf_counter() >= deadline:
                break
        if best is None:
            break
        current, groups = best
        if time.perf_counter() >= deadline:
            break
    return current
