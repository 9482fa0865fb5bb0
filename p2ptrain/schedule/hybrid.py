"""p2ptrain's default search: iterated local search over plans, seeded by link-cost clustering.

1. Seeds: data-parallel groups cut from cluster paths, pipelines of close peers, data-parallel
   groups of close peers, and random plans.
2. Regroup: pool-and-deal moves on the cluster-path seeds' data-parallel groups (``regroup``),
   which fix what single swaps cannot: a group holding a small minority of far-away peers.
3. Polish: swap descent with exact incremental costs (``local_search``), then re-solve the plan's
   partition exactly (pipeline order by Held–Karp, bottleneck matchings) and descend again until
   neither helps. The most promising start goes first.
4. Iterate: perturb the best plan (or, 30% of the time, another elite) with a few random swaps and
   polish, until ``PATIENCE`` rounds in a row bring no improvement (the convergence stop) or the
   budget (evaluations, or the wall-clock cap: ``SearchStats``) runs out.
"""

from __future__ import annotations

import numpy as np

from p2ptrain.schedule.baselines import random_pipelines
from p2ptrain.schedule.cost import CostModel, IntArray, partition_cost
from p2ptrain.schedule.local_search import descend
from p2ptrain.schedule.plan_state import PlanState
from p2ptrain.schedule.regroup import cluster_labels, regroup
from p2ptrain.schedule.search_budget import SearchStats
from p2ptrain.schedule.seeds import groups_seed, path_groups_seeds, pipelines_seed

_EPS = 1e-9
NUM_RANDOM_SEEDS = 2
PATIENCE = 12
NUM_ELITES = 4


def polish(state: PlanState, rng: np.random.Generator) -> PlanState:
    """Descend and re-solve in turn until neither lowers the cost."""
    critical_only = state.model.num_peers > 256
    while True:
        descend(state, rng, critical_only=critical_only)
        if state.stats.spent():
            return state
        resolved = partition_cost(state.model, state.plan.T)
        state.stats.evaluations += 1
        if resolved.cost_s >= state.cost - _EPS:
            return state
        state = PlanState.of(state.model, resolved.pipelines, state.stats)


def perturb(plan: IntArray, spares: IntArray, rng: np.random.Generator, strength: int) -> IntArray:
    """``strength`` random swaps among plan positions and spares."""
    out = plan.copy()
    flat = out.ravel()  # a view: swaps land in ``out``
    pool = np.concatenate([flat, spares])
    if len(pool) < 2:
        return out
    num_planned = flat.size
    for _ in range(strength):
        a, b = rng.choice(len(pool), size=2, replace=False)
        pool[a], pool[b] = pool[b], pool[a]
    flat[:] = pool[:num_planned]
    return out


def hybrid_search(
    model: CostModel, rng: np.random.Generator, stats: SearchStats
) -> tuple[PlanState, str]:
    """Run the search; returns the best plan state and why it stopped."""
    path_seeds = path_groups_seeds(model)
    starts = [*path_seeds, pipelines_seed(model), groups_seed(model)]
    starts += [
        random_pipelines(model.num_peers, model.stages, model.replicas, rng)
        for _ in range(NUM_RANDOM_SEEDS)
    ]
    if model.stages > 1:
        # pool-and-deal every cluster-path seed: cheap, and the seeds differ in where the
        # remainders of the clusters fall
        labels = cluster_labels(model)
        starts += [regroup(model, s, labels, stats).pipelines for s in path_seeds]
    # the most promising start is polished first: on big swarms the budget may not reach the others
    states = sorted((PlanState.of(model, s, stats) for s in starts), key=lambda s: s.key())
    first = states[0]
    elites = [polish(first, rng)]
    for state in states[1:]:
        if stats.spent():
            break
        elites.append(polish(state, rng))
    elites.sort(key=lambda s: s.key())
    best = elites[0]
    stalled = 0
    num_positions = model.num_peers
    while stalled < PATIENCE:
        if stats.spent():
            return best, stats.stop_reason()
        parent = elites[int(rng.integers(len(elites)))] if rng.random() < 0.3 else best
        strength = int(rng.integers(2, max(3, num_positions // 8) + 1))
        child_plan = perturb(parent.plan, parent.spares, rng, strength)
        child = polish(PlanState.of(model, child_plan, stats), rng)
        if child.cost < best.cost - _EPS:
            best, stalled = child, 0
        else:
            stalled += 1
        if all(abs(child.cost - e.cost) > _EPS for e in elites):
            elites.append(child)
            elites.sort(key=lambda s: s.key())
            del elites[NUM_ELITES:]
    return best, "converged"
