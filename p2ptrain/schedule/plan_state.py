"""A plan under local search, with its exact cost cached per column and per stage boundary,
so that a move re-prices only what it touches (local_search.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from p2ptrain.schedule.cost import CostModel, FloatArray, IntArray
from p2ptrain.schedule.search_budget import SearchStats

_EPS = 1e-9  # float noise: a boundary link this close to the worst is critical too


@dataclass
class PlanState:
    """A plan with its cached column and boundary costs."""

    model: CostModel
    plan: IntArray  # (R, S)
    column_dp: FloatArray  # (S,) DP cost of each column
    boundary: FloatArray  # (S-1,) bottleneck of each stage boundary
    spares: IntArray  # peers not in the plan
    stats: SearchStats
    member_sums: FloatArray  # (R, S): each member's DP total within its column
    column_compute: FloatArray  # (S,) slots x the slowest member's stage time (0 w/o compute)

    @classmethod
    def of(cls, model: CostModel, plan: IntArray, stats: SearchStats) -> PlanState:
        plan = np.array(plan, dtype=np.intp)
        spares = np.setdiff1d(np.arange(model.num_peers), plan.ravel()).astype(np.intp)
        stages = plan.shape[1]
        state = cls(
            model,
            plan,
            np.zeros(stages),
            np.zeros(max(stages - 1, 0)),
            spares,
            stats,
            np.zeros(plan.shape),
            np.zeros(stages),
        )
        stats.evaluations += 1
        for col in range(stages):
            state.refresh_column(col)
        for b in range(plan.shape[1] - 1):
            state.boundary[b] = model.pp_pair[plan[:, b], plan[:, b + 1]].max()
        return state

    @property
    def cost(self) -> float:
        return float(self.column_dp.max() + 2 * self.boundary.sum() + self.column_compute.max())

    @property
    def secondary(self) -> float:
        return float(self.column_dp.sum() + 2 * self.boundary.sum() + self.column_compute.sum())

    def key(self) -> tuple[float, float]:
        return self.cost, self.secondary

    def refresh_column(self, col: int) -> None:
        members = self.plan[:, col]
        self.member_sums[:, col] = self.model.dp_pair[members[:, None], members[None, :]].sum(
            axis=1
        )
        self.column_dp[col] = self.member_sums[:, col].max()
        if self.model.stage_s is not None:
            self.column_compute[col] = self.model.slots * self.model.stage_s[members, col].max()

    def critical_peers(self) -> IntArray:
        """Peers whose moves can lower the primary cost: the costliest column and boundary ends."""
        plan = self.plan
        worst_col = int(self.column_dp.argmax())
        peers = [plan[:, worst_col]]
        for b in range(len(self.boundary)):
            links = self.model.pp_pair[plan[:, b], plan[:, b + 1]]
            rows = np.flatnonzero(links >= links.max() - _EPS)
            peers.append(plan[rows, b])
            peers.append(plan[rows, b + 1])
        return np.unique(np.concatenate(peers))
