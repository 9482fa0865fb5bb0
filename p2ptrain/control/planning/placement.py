"""What the scheduler decides, between its result and the signed plan: one chain.

The scheduler's `Schedule` (schedule/planner.py: peer indices) becomes a `Placement` (peer ids),
which the plan maker (plan_maker.py) turns into a `records.Plan` with what the election and the
swarm add (term, epoch, data-plane addresses, network facts, lineage), checked as receivers will
read it (`publishable`). Plain Python: the planner's control process holds no numpy (its numeric
work runs in the planning child: numbers.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from p2ptrain.errors import WireError
from p2ptrain.records import NetworkFacts, Plan
from p2ptrain.records.lineage import Lineage, next_lineage

if TYPE_CHECKING:
    from p2ptrain.schedule import Schedule

log = logging.getLogger(__name__)

# a drift re-plan is published only if it beats the current placement, priced on the same new
# measurements, by this factor: every new placement costs the swarm a restart of its sessions
SWITCH_GAIN = 0.8
MAX_PLAN_COST_S = 1e15  # a plan's costs are finite on the wire (records/plan.py)


class NoPlacementFits(Exception):
    """Every placement the search found gives some peer a stage its device cannot hold."""


@dataclass(frozen=True)
class Placement:
    """What the scheduler decides: the plan's fields that do not depend on the election."""

    stages: int
    pipelines: tuple[tuple[str, ...], ...]
    spares: tuple[str, ...]
    cost_s: float
    stage_layers: tuple[int, ...] = ()  # blocks per stage (schedule/split.py); (): even
    predicted_step_s: float | None = None  # the step simulated on the measured compute
    donors: tuple[str, ...] = ()  # spares kept to hand their stage over (control/handover.py)
    # each donor's blocks [first, end), where known (Plan.donor_blocks)
    donor_blocks: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_schedule(
        cls, schedule: Schedule, peers: Sequence[str], predicted_step_s: float | None = None
    ) -> Placement:
        """The scheduler's result, its peer indices read in `peers` (the matrices' order)."""
        return cls(
            stages=int(schedule.stages),
            pipelines=tuple(tuple(peers[i] for i in pipeline) for pipeline in schedule.pipelines),
            spares=tuple(peers[i] for i in schedule.spares),
            cost_s=float(schedule.cost_s),
            # plain ints and floats: a placement crosses to the control process, which must
            # not load numpy to read it
            stage_layers=tuple(int(blocks) for blocks in schedule.stage_layers),
            predicted_step_s=None if predicted_step_s is None else float(predicted_step_s),
        )

    @classmethod
    def of_plan(cls, plan: Plan) -> Placement:
        """The placement a published plan carries (re-issued as it is): its fields of the
        same names."""
        return cls(**{field.name: getattr(plan, field.name) for field in dataclasses.fields(cls)})

    def with_spares(
        self, donors: Sequence[str], blocks: Mapping[str, tuple[int, int]] | None = None
    ) -> Placement:
        """This placement with `donors` (control/handover.py) among its spares, marked donors
        (none placed at a stage: a stopping peer is no member the search places), with the
        blocks each hands over where `blocks` says."""
        placed = {p for pipeline in self.pipelines for p in pipeline}
        kept = tuple(p for p in dict.fromkeys(donors) if p not in placed)
        marked = tuple(dict.fromkeys(self.donors + kept))
        known = {**self.donor_blocks, **(blocks or {})}
        return dataclasses.replace(
            self,
            spares=self.spares + tuple(p for p in kept if p not in self.spares),
            donors=marked,
            donor_blocks={p: known[p] for p in marked if p in known},
        )

    def without(self, spares: Collection[str]) -> Placement:
        """This placement without these spares (donors gone: control/handover.py)."""
        return dataclasses.replace(
            self,
            spares=tuple(p for p in self.spares if p not in spares),
            donors=tuple(p for p in self.donors if p not in spares),
            donor_blocks={p: b for p, b in self.donor_blocks.items() if p not in spares},
        )

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
            donors=self.donors,
            donor_blocks=dict(self.donor_blocks),
        )


def worth_switching(new_cost_s: float, current_cost_s: float | None) -> bool:
    """Is a new placement enough cheaper than the current one to restart the swarm for it?"""
    return current_cost_s is None or new_cost_s < SWITCH_GAIN * current_cost_s


def clamp(value: float, low: float, high: float) -> float:
    """`value` within [low, high]; NaN stays NaN (a bug the plan's round trip catches)."""
    return value if math.isnan(value) else min(max(value, low), high)


def publishable(plan: Plan) -> Plan | None:
    """`plan` as receivers will read it: its costs clamped to the record's bounds, then encoded
    and decoded with the receivers' own decoder (JSON without NaN or Infinity, Plan.from_dict).
    None, logged loudly, if it does not survive that: a plan receivers refuse blocks its planner
    everywhere (they blame the planner for a malformed plan), so it must never leave."""

    def bounded(cost_s: float | None) -> float | None:
        return None if cost_s is None else clamp(cost_s, 0.0, MAX_PLAN_COST_S)

    cost_s = bounded(plan.cost_s)
    assert cost_s is not None
    clamped = plan.replace(
        cost_s=cost_s,
        previous_cost_s=bounded(plan.previous_cost_s),
        predicted_step_s=bounded(plan.predicted_step_s),
    )
    try:
        return Plan.from_dict(json.loads(json.dumps(clamped.to_dict(), allow_nan=False)))
    except (WireError, ValueError, TypeError) as exc:
        log.error(
            "BUG: plan term %d epoch %d does not decode (%s); not publishing it: %r",
            plan.term,
            plan.epoch,
            exc,
            clamped.to_dict(),
        )
        return None


def plan_lineage(current: Plan | None, term: int, epoch: int, peer_id: str) -> Lineage:
    """The lineage of our plan `term`/`epoch` replacing `current` (records/lineage.py): our own
    id continued within our term, a new one after `current`'s in a new term."""
    previous = () if current is None else current.lineage
    continues = current is not None and current.term == term and current.planner == peer_id
    return next_lineage(previous, continues, term, epoch, peer_id)
