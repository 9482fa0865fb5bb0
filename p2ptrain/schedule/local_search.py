"""Swap local search over explicit plans, with the exact cost updated incrementally.

A plan is an (R, S) array of peers (a row is a pipeline, a column a data-parallel group). A move
swaps two peers, which changes at most two columns' data-parallel cost and four stage boundaries.
For one peer x and one target column, all R candidate swaps are scored at once with numpy, so a
whole neighbourhood costs O(S) vector operations per peer.

The objective is made of maxima, so most swaps leave it unchanged. Ties are broken by a secondary
score (the sum of every column's DP cost and every boundary's bottleneck), which steers the search
across plateaus without ever accepting a worse primary cost.

With measured compute (compute.py) the cost adds slots x the slowest stage time over the plan;
each column caches its slowest member's stage time (plan_state.py), so a swap re-prices two
columns.
"""

from __future__ import annotations

import numpy as np

from p2ptrain.schedule.cost import FloatArray, IntArray
from p2ptrain.schedule.plan_state import PlanState

_EPS = 1e-9


def _candidate_column(plan: IntArray, c: int, row: int, col: int, target_col: int) -> IntArray:
    """Column c of the R candidate plans that swap plan[row, col] with plan[k, target_col]."""
    replicas = plan.shape[0]
    out = np.repeat(plan[None, :, c], replicas, axis=0)  # (K, R)
    ks = np.arange(replicas)
    if c == col:
        out[ks, row] = plan[:, target_col]
    if c == target_col:
        out[ks, ks] = plan[row, col]
    return out


def _swap_scores(
    state: PlanState, row: int, col: int, target_col: int
) -> tuple[FloatArray, FloatArray]:
    """(cost, secondary) of the R swaps of plan[row, col] with each plan[k, target_col].

    Column DP costs are updated from cached per-member sums in O(R^2) rather than O(R^3).
    """
    model, plan, dp = state.model, state.plan, state.model.dp_pair
    replicas, stages = plan.shape
    x = plan[row, col]
    ys = plan[:, target_col]  # partner of candidate k
    state.stats.evaluations += replicas
    new_dp = np.repeat(state.column_dp[None, :], replicas, axis=0)  # (K, S)
    if target_col != col:
        members = plan[:, col]
        sums = state.member_sums[:, col]
        # column col loses x and gains y_k: (K, R)
        col_sums = sums[None, :] - dp[members, x][None, :] + dp[members][:, ys].T
        col_sums[:, row] = dp[ys][:, members].sum(axis=1) - dp[ys, x]
        new_dp[:, col] = col_sums.max(axis=1)
        t_members = ys
        t_sums = state.member_sums[:, target_col]
        # column target_col loses y_k and gains x
        tc_sums = t_sums[None, :] - dp[t_members][:, t_members] + dp[t_members, x][None, :]
        ks = np.arange(replicas)
        tc_sums[ks, ks] = dp[x, t_members].sum() - dp[x, ys]
        new_dp[:, target_col] = tc_sums.max(axis=1)
    new_bound = np.repeat(state.boundary[None, :], replicas, axis=0)  # (K, S-1)
    for b in sorted({b for c in (col, target_col) for b in (c - 1, c) if 0 <= b < stages - 1}):
        left = _candidate_column(plan, b, row, col, target_col)
        right = _candidate_column(plan, b + 1, row, col, target_col)
        new_bound[:, b] = model.pp_pair[left, right].max(axis=1)
    pipeline = 2 * new_bound.sum(axis=1)
    compute = np.repeat(state.column_compute[None, :], replicas, axis=0)  # (K, S)
    if model.stage_s is not None:
        for c in {col, target_col}:
            members = _candidate_column(plan, c, row, col, target_col)
            compute[:, c] = model.slots * model.stage_s[members, c].max(axis=1)
    return _scores(new_dp, pipeline, compute)


def _scores(
    new_dp: FloatArray, pipeline: FloatArray, compute: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """(cost, secondary) of K candidates from their (K, S) column DP and compute and their
    (K,) pipeline term."""
    return (
        new_dp.max(axis=1) + pipeline + compute.max(axis=1),
        new_dp.sum(axis=1) + pipeline + compute.sum(axis=1),
    )


def _spare_scores(state: PlanState, row: int, col: int) -> tuple[FloatArray, FloatArray]:
    """(cost, secondary) of replacing plan[row, col] by each spare."""
    model, plan, dp = state.model, state.plan, state.model.dp_pair
    stages = plan.shape[1]
    spares = state.spares
    num = len(spares)
    state.stats.evaluations += num
    x = plan[row, col]
    members = plan[:, col]
    sums = state.member_sums[:, col]
    col_sums = sums[None, :] - dp[members, x][None, :] + dp[members][:, spares].T  # (K, R)
    col_sums[:, row] = dp[spares][:, members].sum(axis=1) - dp[spares, x]
    new_dp = np.repeat(state.column_dp[None, :], num, axis=0)
    new_dp[:, col] = col_sums.max(axis=1)
    new_bound = np.repeat(state.boundary[None, :], num, axis=0)
    for b in (col - 1, col):
        if 0 <= b < stages - 1:
            left = np.repeat(plan[None, :, b], num, axis=0)
            right = np.repeat(plan[None, :, b + 1], num, axis=0)
            (left if b == col else right)[:, row] = spares
            new_bound[:, b] = model.pp_pair[left, right].max(axis=1)
    pipeline = 2 * new_bound.sum(axis=1)
    compute = np.repeat(state.column_compute[None, :], num, axis=0)
    if model.stage_s is not None:
        column = np.repeat(members[None, :], num, axis=0)
        column[:, row] = spares
        compute[:, col] = model.slots * model.stage_s[column, col].max(axis=1)
    return _scores(new_dp, pipeline, compute)


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Lexicographic (cost, secondary) comparison with a tolerance for float noise."""
    return a[0] < b[0] - _EPS or (a[0] <= b[0] + _EPS and a[1] < b[1] - _EPS)


# A move's partner: (row, col) of a plan position, or (spare index, SPARE).
SPARE = -1


# Below this many entries (candidates x R x S), all of a peer's swaps are scored in one vectorised
# pass: fewer, larger numpy calls win on small swarms.
WHOLE_PLAN_SCORING_LIMIT = 1_000_000


def _all_swap_scores(state: PlanState, row: int, col: int) -> tuple[FloatArray, FloatArray]:
    """(cost, secondary) of swapping plan[row, col] with every plan position, flattened
    column-major (index = target_col * R + k). DP costs are updated from the cached member sums
    (two columns change per candidate); boundaries are recomputed on whole candidate plans."""
    plan, model, dp = state.plan, state.model, state.model.dp_pair
    replicas, stages = plan.shape
    num = replicas * stages
    state.stats.evaluations += num
    ks = np.tile(np.arange(replicas), stages)
    tcs = np.repeat(np.arange(stages), replicas)
    flat = np.arange(num)
    x = plan[row, col]
    ys = plan[ks, tcs]  # partner of each candidate
    # column col: loses x, gains y
    members = plan[:, col]
    col_sums = state.member_sums[:, col][None, :] - dp[members, x][None, :] + dp[members][:, ys].T
    col_sums[:, row] = dp[ys][:, members].sum(axis=1) - dp[ys, x]
    # column tc: loses y, gains x
    t_members = plan[:, tcs].T  # (K, R)
    tc_sums = state.member_sums[:, tcs].T - dp[t_members, ys[:, None]] + dp[t_members, x]
    tc_sums[flat, ks] = dp[x][t_members].sum(axis=1) - dp[x, ys]
    new_dp = np.repeat(state.column_dp[None, :], num, axis=0)  # (K, S)
    moved = tcs != col  # a swap inside one column leaves its DP as it is
    new_dp[moved, col] = col_sums[moved].max(axis=1)
    new_dp[flat[moved], tcs[moved]] = tc_sums[moved].max(axis=1)
    cand = np.repeat(plan[None, :, :], num, axis=0)  # (K, R, S)
    cand[flat, row, col] = ys
    cand[flat, ks, tcs] = x
    pipeline = 2 * model.pp_pair[cand[:, :, :-1], cand[:, :, 1:]].max(axis=1).sum(axis=1)
    if model.stage_s is None:
        compute = np.zeros((num, stages))
    else:
        compute = model.slots * model.stage_s[cand, np.arange(stages)].max(axis=1)  # (K, S)
    return _scores(new_dp, pipeline, compute)


def best_swap_for(
    state: PlanState, peer: int, positions: IntArray
) -> tuple[float, float, int, int] | None:
    """The best swap of a planned ``peer`` with any other position or spare, if it improves.

    positions[p] = (row, col) of peer p. Returns (cost, secondary, row, col) of the partner, with
    col == SPARE and row = index into state.spares for a spare.
    """
    stages = state.plan.shape[1]
    row, col = positions[peer]
    best_key = state.key()
    best: tuple[float, float, int, int] | None = None
    replicas = state.plan.shape[0]
    if (replicas * stages) ** 2 * replicas <= WHOLE_PLAN_SCORING_LIMIT:
        cost, secondary = _all_swap_scores(state, row, col)
        cost[col * replicas + row] = np.inf  # the peer with itself
        f = int(np.lexsort((secondary, cost))[0])
        key = (float(cost[f]), float(secondary[f]))
        if _better(key, best_key):
            best_key, best = key, (key[0], key[1], f % replicas, f // replicas)
    else:
        best_key, best = _best_by_column(state, row, col, best_key)
    if len(state.spares):
        cost, secondary = _spare_scores(state, row, col)
        k = int(np.lexsort((secondary, cost))[0])
        key = (float(cost[k]), float(secondary[k]))
        if _better(key, best_key):
            best = (key[0], key[1], k, SPARE)
    return best


def _best_by_column(
    state: PlanState, row: int, col: int, best_key: tuple[float, float]
) -> tuple[tuple[float, float], tuple[float, float, int, int] | None]:
    """Best improving swap, scoring one target column at a time (for big swarms)."""
    best: tuple[float, float, int, int] | None = None
    for target_col in range(state.plan.shape[1]):
        cost, secondary = _swap_scores(state, row, col, target_col)
        if target_col == col:
            cost[row] = np.inf  # the peer with itself
        k = int(np.lexsort((secondary, cost))[0])
        key = (float(cost[k]), float(secondary[k]))
        if _better(key, best_key):
            best_key, best = key, (key[0], key[1], k, target_col)
    return best_key, best


def apply_swap(state: PlanState, a: tuple[int, int], b: tuple[int, int]) -> None:
    """Swap plan position a with plan position b, or with spare b[0] when b[1] == SPARE."""
    plan = state.plan
    if b[1] == SPARE:
        plan[a], state.spares[b[0]] = state.spares[b[0]], plan[a]
        touched = {a[1]}
    else:
        plan[a], plan[b] = plan[b], plan[a]
        touched = {a[1], b[1]}
    model = state.model
    stages = plan.shape[1]
    for c in touched:
        state.refresh_column(c)
        for bd in (c - 1, c):
            if 0 <= bd < stages - 1:
                state.boundary[bd] = model.pp_pair[plan[:, bd], plan[:, bd + 1]].max()


def positions_of(plan: IntArray, num_peers: int) -> IntArray:
    pos = np.full((num_peers, 2), -1, dtype=np.intp)
    rows, cols = np.indices(plan.shape)
    pos[plan.ravel(), 0] = rows.ravel()
    pos[plan.ravel(), 1] = cols.ravel()
    return pos


def descend(
    state: PlanState,
    rng: np.random.Generator,
    critical_only: bool,
) -> int:
    """Descend until no swap of a (critical) peer improves; returns the number of moves made.

    Each step takes the best move of the first peer (in random order) that has an improving one.
    """
    moves = 0
    num_peers = state.model.num_peers
    while not state.stats.spent():
        pos = positions_of(state.plan, num_peers)
        peers = state.critical_peers() if critical_only else state.plan.ravel().copy()
        rng.shuffle(peers)
        improved = False
        for peer in peers:
            if state.stats.spent():
                return moves
            found = best_swap_for(state, int(peer), pos)
            if found is None:
                continue
            _, _, k, target_col = found
            apply_swap(state, (int(pos[peer][0]), int(pos[peer][1])), (k, target_col))
            moves += 1
            improved = True
            break  # positions and critical set changed
        if not improved:
            break
    return moves
