"""The paper's hybrid genetic algorithm (after Kang & Moon's GCMA), kept for comparison.

Steady-state population of random balanced partitions; each offspring is a five-point crossover of
two random parents, repaired to equal group sizes, then improved by one pass of cyclic local search
(moves chained through groups so sizes stay equal, best prefix kept), and replaces the worse parent
if it is better. Fitness is the exact partition cost. Unlike the reference code it is seeded, and
children that are kept do breed.
"""

from __future__ import annotations

import numpy as np

from p2ptrain.schedule.cost import CostModel, IntArray, partition_cost
from p2ptrain.schedule.search_budget import SearchStats

POPULATION = 100
OFFSPRING = 4900
CROSSOVER_POINTS = 5


def _groups(labels: IntArray, peers: IntArray, num_groups: int) -> IntArray:
    return np.stack([peers[labels == g] for g in range(num_groups)])


def _crossover(
    a: IntArray, b: IntArray, num_groups: int, size: int, rng: np.random.Generator
) -> IntArray:
    """Copy a few of parent a's labels into parent b, then repair group sizes."""
    child = b.copy()
    points = rng.choice(len(a), size=min(CROSSOVER_POINTS, len(a)), replace=False)
    child[points] = a[points]
    counts = np.bincount(child, minlength=num_groups)
    for v in range(len(child)):
        if counts[child[v]] > size:
            target = int(np.flatnonzero(counts < size)[0])
            counts[child[v]] -= 1
            counts[target] += 1
            child[v] = target
    return child


def _gains(
    weight: np.ndarray, labels: IntArray, locked: np.ndarray, num_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gain[v, q]: average cost from v to group q; gain[v, own]: v's fastest in-group link.

    Per group p, the unlocked member with the fastest in-group link is the mover; its best target
    q maximises gain[v, q] - gain[v, p]. Returns (G_ij, G_i, movers with their targets).
    """
    num = len(labels)
    onehot = np.eye(num_groups)[labels]  # (N, S)
    sizes = onehot.sum(axis=0)
    gain = (weight @ onehot) / np.maximum(sizes, 1)
    same = labels[:, None] == labels[None, :]
    np.fill_diagonal(same, False)
    inner = np.where(same, weight, np.inf).min(axis=1)
    gain[np.arange(num), labels] = inner
    g_ij = np.full((num_groups, num_groups), -np.inf)
    g_i = np.full(num_groups, -np.inf)
    movers = np.full((num_groups, 2), -1, dtype=np.intp)
    for p in range(num_groups):
        members = np.flatnonzero((labels == p) & ~locked)
        if len(members) == 0:
            continue
        v = int(members[np.argmin(inner[members])])
        delta = gain[v] - gain[v, p]
        delta[p] = -np.inf
        g_ij[p] = delta
        q = int(np.argmax(delta))
        g_i[p], movers[p] = delta[q], (v, q)
    return g_ij, g_i, movers


def _cyclic_local_search(weight: np.ndarray, labels: IntArray, num_groups: int) -> IntArray:
    """One pass of the paper's cyclic partitioning local search."""
    locked = np.zeros(len(labels), dtype=bool)
    locked_groups = np.zeros(num_groups, dtype=bool)
    snapshots = [labels.copy()]
    cycle_gains = [0.0]
    current = labels.copy()
    for _ in range(num_groups):
        trial = current.copy()
        moves: list[tuple[int, int, int]] = []
        eps: list[float] = []
        tau: list[float] = []
        g_ij, g_i, movers = _gains(weight, trial, locked, num_groups)
        start = si = int(np.argmax(g_i))
        for _ in range(len(labels)):
            v, target = int(movers[si, 0]), int(movers[si, 1])
            if v < 0:
                if not moves:
                    break
                v, target = moves[-1][0], start
            trial[v] = target
            locked[v] = True
            locked_groups[target] = True
            moves.append((v, si, target))
            eps.append(float(g_i[si]))
            tau.append(float(g_ij[si, start]))
            si = target
            if si == start:
                break
            g_ij, g_i, movers = _gains(weight, trial, locked, num_groups)
        if not moves:
            break
        best_sum, best_l = 0.0, 0
        for i in range(1, len(eps)):
            total = float(np.sum(eps[:i])) + tau[i]
            if total > best_sum:
                best_sum, best_l = total, i
        for i in range(len(eps) - 1, best_l, -1):
            trial[moves[i][0]] = moves[i][1]
        trial[moves[best_l][0]] = start
        current = trial
        snapshots.append(trial.copy())
        cycle_gains.append(best_sum)
        if locked_groups.all():
            break
    prefix = np.cumsum(cycle_gains)
    return snapshots[int(np.argmax(prefix))]


def paper_search(
    model: CostModel, rng: np.random.Generator, stats: SearchStats
) -> tuple[IntArray, str]:
    """Returns the best plan found (pipelines) and why the search stopped."""
    num_groups, size = model.stages, model.replicas
    peers = rng.permutation(model.num_peers)[: num_groups * size]
    weight = model.pp_pair[np.ix_(peers, peers)]
    base = np.repeat(np.arange(num_groups), size)
    population = [rng.permutation(base) for _ in range(POPULATION)]
    scores = []
    for labels in population:
        scores.append(partition_cost(model, _groups(labels, peers, num_groups)).cost_s)
        stats.evaluations += 1
    stopped = "converged"
    for _ in range(OFFSPRING):
        if stats.spent():
            stopped = stats.stop_reason()
            break
        i, j = rng.integers(POPULATION, size=2)
        child = _crossover(population[i], population[j], num_groups, size, rng)
        if size > 1 and num_groups > 1:  # the gains need an in-group link and a group to move to
            child = _cyclic_local_search(weight, child, num_groups)
        score = partition_cost(model, _groups(child, peers, num_groups)).cost_s
        stats.evaluations += 1
        worse = i if scores[i] >= scores[j] else j
        if score < scores[worse]:
            population[worse], scores[worse] = child, score
    best = population[int(np.argmin(scores))]
    return partition_cost(model, _groups(best, peers, num_groups)).pipelines, stopped
