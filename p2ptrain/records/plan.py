"""The plan: who trains which stage of which pipeline, and the network it was made for.

Made by the elected planner (control/planning/plan_maker.py) or by a harness that places workers
itself; gossiped inside a signed envelope, handed to the worker over its socket, written to
metrics logs.
A plan of term 0 was made without an election (a harness's static plan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from p2ptrain.records import fields as f
from p2ptrain.records import lineage as lin
from p2ptrain.records.codec import (
    Addrs,
    Custom,
    Int,
    Map,
    OneOf,
    PeerId,
    PeerIds,
    Record,
    Seq,
    Wire,
)
from p2ptrain.records.network import MAX_STAGES, LinkFacts, NetworkFacts

MAX_STAGE_LAYERS = 1_000_000  # blocks one stage may hold (a bound for the wire, not a model)


# why a planner published a plan: the first one; the members changed (a join, a leave, a death,
# a peer turned unhealthy); the links drifted; peers' compute was newly measured; only the
# data-plane addresses changed (same placement)
PLAN_REASONS = ("first", "members", "drift", "compute", "addresses")


OMITTED = Wire(omit_default=True)  # left out of the object while it holds its default
# blocks per stage: empty (the model's even cut) or one count >= 1 per stage (a plan's
# __post_init__ checks that; their sum against the run's n_layer where the run is known)
StageLayers = Annotated[tuple[int, ...], Seq(Int(1, MAX_STAGE_LAYERS), MAX_STAGES)]
Reason = Annotated[str, OneOf(PLAN_REASONS, empty=True)]  # "": not said


def _blocks(value: object, record: str, name: str) -> tuple[int, int]:
    """[first, end): the blocks a donor trained, 0 <= first < end <= MAX_STAGE_LAYERS."""
    if not isinstance(value, list) or len(value) != 2:
        raise f.malformed(record, f"{name} must be [first, end]")
    first = f.integer(value[0], record, name, 0, MAX_STAGE_LAYERS - 1)
    end = f.integer(value[1], record, name, first + 1, MAX_STAGE_LAYERS)
    return first, end


@dataclass(frozen=True)
class Role:
    """What a plan asks of one peer: which stage of which replica, and its neighbours."""

    term: int  # the plan's (term, epoch): every frame between neighbours names it
    epoch: int
    stage: int
    num_stages: int
    replica: int
    num_replicas: int
    prev_peer: str | None  # sends us activations, receives our gradients
    next_peer: str | None  # receives our activations, sends us gradients
    stage_peers: tuple[str, ...]  # everyone holding our stage, one per replica

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def plan_key(self) -> tuple[int, int]:
        """The (term, epoch) of the plan that gave this role."""
        return self.term, self.epoch


@dataclass(frozen=True)
class Plan(Record, name="plan"):
    """Pipelines list one peer per stage; a replica is one pipeline; spares wait."""

    term: int  # the planner's election term (0: no election)
    epoch: int  # the planner's plan counter within its term
    # the planner's peer id, or the name of the harness that placed the peers
    planner: Annotated[str, PeerId()]
    stages: Annotated[int, Int(1, MAX_STAGES)]
    pipelines: Annotated[tuple[tuple[str, ...], ...], Seq(PeerIds(), f.MAX_PEERS, min_items=1)]
    spares: Annotated[tuple[str, ...], PeerIds()]
    # peer id -> its data-plane multiaddrs
    data_addrs: Annotated[Mapping[str, tuple[str, ...]], Map(Addrs())]
    cost_s: float  # the scheduler's predicted cost of one step
    network: Annotated[NetworkFacts | None, OMITTED] = None
    # (lineage id, epoch) pairs, newest first: whose stage states it may use (records/lineage.py)
    lineage: Annotated[lin.Lineage, Custom(lin.parse, lin.to_wire), OMITTED] = ()
    # blocks per stage where a compute-aware planner split them unevenly; empty: the model's
    # near-equal cut (layer_ranges), as in older plans and harness plans
    stage_layers: Annotated[StageLayers, OMITTED] = ()
    # why the planner made it (PLAN_REASONS; "" in older and harness plans), what the plan it
    # replaces costs on the same measurements (the predicted gain is the difference), and the
    # step the planner simulated for it on the measured links and compute (None: not simulated)
    reason: Annotated[Reason, OMITTED] = ""
    previous_cost_s: Annotated[float | None, OMITTED] = None
    predicted_step_s: Annotated[float | None, OMITTED] = None
    # the spares that stay only to hand their stage over (control/handover.py): no copy duty
    # is theirs (worker/resume/copy_server.py), they leave once their state is fetched
    donors: Annotated[tuple[str, ...], PeerIds(), OMITTED] = ()
    # donor -> the blocks [first, end) of the stage it hands over (the plan that placed it
    # says): the start agreement hears it first on those blocks, and only on those
    # (worker/resume/covers.py); absent from older plans: a donor is then one more spare
    donor_blocks: Annotated[Mapping[str, tuple[int, int]], Map(Custom(_blocks, list)), OMITTED] = (
        dataclasses.field(default_factory=dict)
    )

    def __post_init__(self) -> None:
        layers = self.stage_layers
        if layers and (len(layers) != self.stages or min(layers) < 1):
            raise ValueError(f"stage_layers {layers} must list >= 1 block for each stage")
        if not set(self.donors) <= set(self.spares):
            raise ValueError("every donor must be one of the plan's spares")
        if not set(self.donor_blocks) <= set(self.donors):
            raise ValueError("donor_blocks names a peer that is no donor")

    def donor_ranges(self) -> dict[str, range]:
        """Each donor's blocks, as ranges (what the start agreement hears it first on)."""
        return {peer: range(first, end) for peer, (first, end) in self.donor_blocks.items()}

    @property
    def key(self) -> tuple[int, int]:
        """Plans order by (term, epoch)."""
        return self.term, self.epoch

    @property
    def num_replicas(self) -> int:
        return len(self.pipelines)

    def peers(self) -> set[str]:
        """Every peer the plan names: pipeline members and spares."""
        return {p for pipeline in self.pipelines for p in pipeline} | set(self.spares)

    def same_placement(self, other: Plan) -> bool:
        """Do both plans put every peer at the same place, on the same layers? (Then a session
        can go on.)"""
        return (
            self.stages == other.stages
            and self.pipelines == other.pipelines
            and self.stage_layers == other.stage_layers
        )

    def layer_problem(self, n_layer: int) -> str | None:
        """Why this plan cannot cut a model of `n_layer` blocks (None: it can)."""
        if self.stages > n_layer:
            return f"{self.stages} stages for {n_layer} layers"
        if self.stage_layers and sum(self.stage_layers) != n_layer:
            return f"stage_layers {list(self.stage_layers)} do not sum to {n_layer} layers"
        return None

    def layer_ranges(self, n_layer: int) -> list[range]:
        """The blocks of each stage: `stage_layers` in order, or (empty) the model's near-equal
        cut, earlier stages taking the remainder (train/model.py). ValueError if the plan does
        not fit the model (layer_problem)."""
        problem = self.layer_problem(n_layer)
        if problem is not None:
            raise ValueError(f"cannot cut the model: {problem}")
        sizes = self.stage_layers or even_layers(n_layer, self.stages)
        ranges, start = [], 0
        for size in sizes:
            ranges.append(range(start, start + size))
            start += size
        return ranges

    def role_of(self, peer_id: str) -> Role | None:
        """This peer's role, or None if the plan leaves it out (a spare, or not named)."""
        for replica, pipeline in enumerate(self.pipelines):
            if peer_id in pipeline:
                stage = pipeline.index(peer_id)
                return Role(
                    term=self.term,
                    epoch=self.epoch,
                    stage=stage,
                    num_stages=self.stages,
                    replica=replica,
                    num_replicas=len(self.pipelines),
                    prev_peer=pipeline[stage - 1] if stage > 0 else None,
                    next_peer=pipeline[stage + 1] if stage + 1 < len(pipeline) else None,
                    stage_peers=tuple(p[stage] for p in self.pipelines),
                )
        return None

    def link_facts(self, a: str, b: str) -> LinkFacts | None:
        """What the plan's network says of the link between peers a and b: their stage group's
        facts if they hold the same stage, the hop's if they are pipeline neighbours, else the
        swarm-wide pair; None for a plan without network facts (a local network)."""
        network = self.network
        if network is None:
            return None
        where = {
            p: (r, j) for r, pipeline in enumerate(self.pipelines) for j, p in enumerate(pipeline)
        }
        if a not in where or b not in where:
            return network.swarm
        (ra, ja), (rb, jb) = where[a], where[b]
        if ja == jb:
            return network.group(ja)
        if ra == rb and abs(ja - jb) == 1:
            return network.hop(ra, min(ja, jb))
        return network.swarm

    @property
    def state_tag(self) -> str | None:
        """The lineage tag of stage states saved under this plan (None: the root, untagged)."""
        return lin.tag_of(self.lineage)

    def state_rank(self, tag: str | None) -> int | None:
        """How close a state of lineage `tag` is to this plan (0: its own lineage), or None if
        the plan must not use it: it was saved in another lineage (a partition's other half)."""
        return lin.rank(self.lineage, tag)

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)

    def wire_problem(self) -> str | None:
        problem = placement_problem(self.stages, self.pipelines, self.spares, self.donors)
        if problem:
            return problem
        network = self.network
        if network is not None and network.groups and len(network.groups) != self.stages:
            return "network.groups must list one pair per stage"
        if (
            network is not None
            and network.hops
            and (
                len(network.hops) != len(self.pipelines)
                or any(len(h) != self.stages - 1 for h in network.hops)
            )
        ):
            return "network.hops must list stages - 1 pairs per pipeline"
        if self.lineage and self.lineage[0][1] != self.epoch:
            return "the lineage's first entry must be at the plan's epoch"
        return None


def placement_problem(
    stages: int,
    pipelines: tuple[tuple[str, ...], ...],
    spares: tuple[str, ...],
    donors: tuple[str, ...],
) -> str | None:
    """What is wrong with a placement as a peer sent it (a plan, or status's summary of one)."""
    if any(len(p) != stages for p in pipelines):
        return "every pipeline must list exactly `stages` peers"
    named = [p for pipeline in pipelines for p in pipeline] + list(spares)
    if len(named) > f.MAX_PEERS:
        return f"more than {f.MAX_PEERS} peers"
    if len(set(named)) != len(named):
        return "a peer appears more than once"
    if len(set(donors)) != len(donors) or not set(donors) <= set(spares):
        return "every donor must be one of the plan's spares, once"
    return None


def even_layers(n_layer: int, stages: int) -> tuple[int, ...]:
    """The model's own cut: near-equal blocks per stage, earlier stages taking the remainder."""
    base, extra = divmod(n_layer, stages)
    return tuple(base + (1 if j < extra else 0) for j in range(stages))
