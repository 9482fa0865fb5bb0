"""What the scheduler decides, between its result and the signed plan: one chain.

The scheduler's `Schedule` (schedule/planner.py: peer indices) becomes a `Placement` (peer ids),
which the plan maker (plan_maker.py) turns into a `records.Plan` with what the election and the
swarm add (term, epoch, data-plane addresses, network facts, lineage).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from p2ptrain.records import NetworkFacts, Plan
from p2ptrain.records.lineage import Lineage

if TYPE_CHECKING:
    from p2ptrain.schedule import Schedule


@dataclass(frozen=True)
class Placement:
    """What the scheduler decides: the plan's fields that do not depend on the election."""

    stages: int
    pipelines: tuple[tuple[str, ...], ...]
    spares: tuple[str, ...]
    cost_s: float
    stage_layers: tuple[int, ...] = ()  # blocks per stage (schedule/split.py); (): even
    predicted_step_s: float | None = None  # the step simulated on the measured compute

    @classmethod
    def from_schedule(
        cls, schedule: Schedule, peers: Sequence[str], predicted_step_s: float | None = None
    ) -> Placement:
        """The scheduler's result, its peer indices read in `peers` (the matrices' order)."""
        return cls(
            stages=schedule.stages,
            pipelines=tuple(tuple(peers[i] for i in pipeline) for pipeline in schedule.pipelines),
            spares=tuple(peers[i] for i in schedule.spares),
            cost_s=float(schedule.cost_s),
            stage_layers=tuple(schedule.stage_layers),
            predicted_step_s=predicted_step_s,
        )

    @classmethod
    def of_plan(cls, plan: Plan) -> Placement:
        """The placement a published plan carries (re-issued as it is): its fields of the
        same names."""
        return cls(**{field.name: getattr(plan, field.name) for field in dataclasses.fields(cls)})

    def to_plan(
        self,
        *,
        term: int,
        epoch: int,
        planner: str,
        data_addrs: dict[str, tuple[str, ...]],
        network: NetworkFacts | None,
        lineage: Lineage,
        reason: str,
        previous_cost_s: float | None,
    ) -> Plan:
        """The plan of this placement, with what the election and the swarm add."""
        return Plan(
            term=term,
            epoch=epoch,
            planner=planner,
            stages=self.stages,
            pipelines=self.pipelines,
            spares=self.spares,
            data_addrs=data_addrs,
            cost_s=self.cost_s,
            stage_layers=self.stage_layers,
            network=network,
            lineage=lineage,
            reason=reason,
            previous_cost_s=previous_cost_s,
            predicted_step_s=self.predicted_step_s,
        )
