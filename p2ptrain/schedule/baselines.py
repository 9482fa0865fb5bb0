"""The paper's baselines and ablation, for comparison with the search.

- ``random``: the peers dealt at random (``random_pipelines``, the project's one random-placement
  rule: the scheduler's baseline, the search's random starts, the live planner's `placement =
  "random"` and the harness's random plans all deal with it).
- ``identity``: peers in listed order, the way Megatron places ranks by default (rank = stage x R +
  replica, so each data-parallel group is a block of consecutive peers).
- ``kl``: the paper's Kernighan–Lin ablation: pair swaps between groups chosen by the classic gain
  (external minus internal cost, here on activation-transfer costs), in passes with the best prefix
  kept, the groups then ordered and matched exactly.
"""

from __future__ import annotations

import numpy as np

from p2ptrain.schedule.cost import CostModel, IntArray, partition_cost
from p2ptrain.schedule.search_budget import SearchStats

_EPS = 1e-12


def random_pipelines(
    num_peers: int, stages: int, replicas: int, rng: np.random.Generator
) -> IntArray:
    """Peers 0..num_peers-1 dealt by one permutation drawn from `rng`: its first stages x
    replicas fill the pipelines row by row (pipelines[i][j]: the peer at stage j of replica i),
    the rest are spares. The same generator state gives the same placement."""
    chosen = rng.permutation(num_peers)[: stages * replicas]
    return chosen.reshape(replicas, stages)


def identity_assignment(model: CostModel) -> IntArray:
    groups = np.arange(model.stages * model.replicas).reshape(model.stages, model.replicas)
    return groups.T.copy()


def kernighan_lin(model: CostModel, rng: np.random.Generator, stats: SearchStats) -> IntArray:
    """KL passes on a random balanced partition; returns the resulting plan (order solved)."""
    num_planned = model.stages * model.replicas
    peers = rng.permutation(model.num_peers)[:num_planned]
    labels = np.repeat(np.arange(model.stages), model.replicas)
    weight = model.pp_pair[np.ix_(peers, peers)]
    while not stats.spent():
        labels, gained = _kl_pass(weight, labels, model.stages)
        stats.evaluations += 1
        if not gained:
            break
    groups = np.stack([peers[labels == g] for g in range(model.stages)])
    stats.evaluations += 1
    return partition_cost(model, groups).pipelines


def _kl_pass(weight: np.ndarray, labels: np.ndarray, num_groups: int) -> tuple[np.ndarray, bool]:
    """One pass: lock-and-swap the best pair repeatedly, keep the best prefix of swaps."""
    labels = labels.copy()
    num = len(labels)
    locked = np.zeros(num, dtype=bool)
    swaps: list[tuple[int, int]] = []
    gains: list[float] = []
    for _ in range(num // 2):
        # to_group[v, g]: v's total cost to members of group g
        to_group = np.stack([weight[:, labels == g].sum(axis=1) for g in range(num_groups)], axis=1)
        internal = to_group[np.arange(num), labels]
        free = np.flatnonzero(~locked)
        if len(free) < 2:
            break
        a = free[:, None]
        b = free[None, :]
        # gain of swapping a and b (different groups): external minus internal, both sides
        gain = (
            internal[a]
            - to_group[a, labels[b]]
            + internal[b]
            - to_group[b, labels[a]]
            + 2 * weight[a, b]
        )
        gain = np.where(labels[a] != labels[b], gain, -np.inf)
        flat = int(np.argmax(gain))
        ia, ib = free[flat // len(free)], free[flat % len(free)]
        if not np.isfinite(gain.ravel()[flat]):
            break
        labels[ia], labels[ib] = labels[ib], labels[ia]
        locked[[ia, ib]] = True
        swaps.append((ia, ib))
        gains.append(float(gain.ravel()[flat]))
    prefix = np.cumsum(gains) if gains else np.zeros(0)
    keep = int(prefix.argmax()) + 1 if len(prefix) and prefix.max() > _EPS else 0
    for ia, ib in reversed(swaps[keep:]):
        labels[ia], labels[ib] = labels[ib], labels[ia]
    return labels, keep > 0
