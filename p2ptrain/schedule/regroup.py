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
from collections.abc import Callable

import numpy as np

from p2ptrain.schedule.cost import (
    CostModel,
    Evaluation,
    IntArray,
    bottleneck_matching,
    dp_group_costs,
    open_path,
    partition_cost,
)
from p2ptrain.schedule.search_budget import SearchStats

MAX_CLUSTERS = 32
_EPS = 1e-9

Dealer = Callable[[IntArray, int], list[IntArray]]


def cluster_labels(model: CostModel) -> IntArray:
    """Average-linkage clusters of peers by activation-transfer cost, numbered along the cheapest
    path through them, so that sorting by label puts neighbouring clusters side by side."""
    pair = (model.pp_pair + model.pp_pair.T) / 2
    np.fill_diagonal(pair, 0.0)
    if model.num_peers < 2:
        return np.zeros(model.num_peers, dtype=np.intp)
    from scipy.cluster.hierarchy import fcluster, linkage  # in searches only, as cost.py's
    from scipy.spatial.distance import squareform

    tree = linkage(squareform(pair, checks=False), method="average")
    raw = fcluster(tree, t=min(MAX_CLUSTERS, model.num_peers), criterion="maxclust")
    names = np.unique(raw)
    members = [np.flatnonzero(raw == c) for c in names]
    between = np.array([[pair[np.ix_(a, b)].mean() for b in members] for a in members])
    _, path = open_path(between)
    labels = np.empty(model.num_peers, dtype=np.intp)
    for rank, cluster in enumerate(path):
        labels[members[int(cluster)]] = rank
    return labels


def _round_robin(pool: IntArray, count: int) -> list[IntArray]:
    return [pool[i::count] for i in range(count)]


def _blocks(pool: IntArray, count: int) -> list[IntArray]:
    size = len(pool) // count
    return [pool[i * size : (i + 1) * size] for i in range(count)]


DEALERS: tuple[Dealer, ...] = (_round_robin, _blocks)


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[0] - _EPS or (a[0] <= b[0] + _EPS and a[1] < b[1] - _EPS)


class _Chain:
    """Groups in a fixed stage order with cached DP costs and boundary bottlenecks.

    Its cost is an upper bound on the partition's exact cost (the exact cost also optimises the
    order), so a move that lowers it lowers the true cost too, at a fraction of the price."""

    def __init__(self, model: CostModel, evaluation: Evaluation) -> None:
        self.model = model
        self.groups = np.ascontiguousarray(evaluation.pipelines.T)  # row = stage, in order
        self.dp = dp_group_costs(model, self.groups)
        self.links = np.array([self._link(a, b) for a, b in itertools.pairwise(self.groups)])

    def _link(self, a: IntArray, b: IntArray) -> float:
        return bottleneck_matching(self.model.pp_pair[np.ix_(a, b)])[0]

    @property
    def cost(self) -> float:
        return float(self.dp.max() + 2 * self.links.sum())

    @property
    def key(self) -> tuple[float, float]:
        """(cost, Σ group DP + 2 Σ boundaries): the sum lets moves improve groups other than the
        costliest, so several bad groups can be fixed one after the other."""
        pipeline = 2 * float(self.links.sum())
        return float(self.dp.max()) + pipeline, float(self.dp.sum()) + pipeline

    def try_replace(self, members: tuple[int, ...], new: IntArray) -> tuple[float, float]:
        """The key if the groups at stages ``members`` became the rows of ``new``."""
        dp = self.dp.copy()
        dp[list(members)] = dp_group_costs(self.model, new)
        groups = self.groups.copy()
        groups[list(members)] = new
        links = self.links.copy()
        for b in sorted({b for m in members for b in (m - 1, m) if 0 <= b < len(links)}):
            links[b] = self._link(groups[b], groups[b + 1])
        pipeline = 2 * float(links.sum())
        return float(dp.max()) + pipeline, float(dp.sum()) + pipeline

    def focus(self) -> list[int]:
        """Stages to rebuild, most promising first: the costliest group by DP, the two ends of the
        costliest boundary, then every other group by decreasing DP."""
        by_dp = [int(g) for g in np.argsort(-self.dp, kind="stable")]
        focus = by_dp[:1]
        if len(self.links):
            b = int(self.links.argmax())
            focus += [b, b + 1]
        return list(dict.fromkeys(focus + by_dp[1:]))


def _candidate_sets(groups: IntArray, labels: IntArray, focus: int) -> list[tuple[int, ...]]:
    """The focus group with any one other group, or with two or three that share clusters."""
    num_groups = groups.shape[0]
    kinds = set(labels[groups[focus]].tolist())
    sharing = [
        g for g in range(num_groups) if g != focus and kinds & set(labels[groups[g]].tolist())
    ]
    sets: list[tuple[int, ...]] = [(focus, g) for g in range(num_groups) if g != focus]
    sets += [(focus, *c) for size in (2, 3) for c in itertools.combinations(sharing, size)]
    return sets


def regroup(
    model: CostModel,
    pipelines: IntArray,
    labels: IntArray,
    stats: SearchStats,
    max_rounds: int = 60,
) -> Evaluation:
    """Improve a plan's partition by pool-and-deal moves; returns the best exact evaluation.

    Moves are priced on the current stage order (``_Chain``); after each accepted move the order and
    matchings are re-solved exactly, which can only lower the cost further.
    """
    current = partition_cost(model, np.ascontiguousarray(pipelines.T))
    stats.evaluations += 1
    if model.stages < 2:
        return current
    chain = _Chain(model, current)
    for _ in range(max_rounds):
        best: tuple[tuple[float, float], tuple[int, ...], IntArray] | None = None
        for focus in chain.focus():
            for members in _candidate_sets(chain.groups, labels, focus):
                pool = np.concatenate([chain.groups[g] for g in members])
                pool = pool[np.argsort(labels[pool], kind="stable")]
                for dealer in DEALERS:
                    new = np.stack(dealer(pool, len(members)))
                    key = chain.try_replace(members, new)
                    stats.evaluations += 1
                    if _better(key, best[0] if best else chain.key):
                        best = (key, members, new)
                if stats.spent():
                    break
            if best is not None or stats.spent():
                break
        if best is None:
            break
        groups = chain.groups.copy()
        groups[list(best[1])] = best[2]
        resolved = partition_cost(model, groups)
        stats.evaluations += 1
        if resolved.cost_s < current.cost_s - _EPS:
            current = resolved
        chain = _Chain(model, resolved)
        if stats.spent():
            break
    return current
