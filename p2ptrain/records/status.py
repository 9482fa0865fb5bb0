"""The status document: one node's view of the swarm (the status RPC, `p2ptrain status --json`).

Its JSON fields are a contract relied on outside the project: add fields, never rename or drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from p2ptrain.records.codec import (
    Addrs,
    FreeForm,
    Int,
    Map,
    Nested,
    Nullable,
    Num,
    OneOf,
    PeerId,
    PeerIds,
    Record,
    Seq,
    Text,
    Wire,
)
from p2ptrain.records.peer import (
    CONNECTIONS,
    MAX_PROTOCOL_LEVEL,
    MAX_RELAYS,
    ROLES,
    Health,
    PeerMetrics,
    StageCompute,
)
from p2ptrain.records.plan import MAX_STAGES, Plan, Reason, StageLayers, placement_problem
from p2ptrain.records.reachability import REACHABILITY

MAX_STATUS_PEERS = 10_000
MAX_WAIT_KIND_CHARS = 32
MAX_WAIT_CHARS = 1000
MAX_STATUS_LINKS = 200_000


OMITTED = Wire(omit_default=True)
NONE_IF_ABSENT = Wire(absent=None)


@dataclass(frozen=True)
class PeerStatus(Record, name="status peer"):
    id: Annotated[str, PeerId()]
    alive: bool
    planner: bool
    role: Annotated[str, OneOf(ROLES)]
    addrs: Annotated[tuple[str, ...], Addrs()]
    data_addrs: Annotated[tuple[str, ...], Addrs(), Wire(absent=())]
    version: Annotated[str, Wire(absent="?")]
    hardware: Annotated[dict[str, Any], FreeForm(), Wire(absent={})]
    compute_gflops: Annotated[float | None, NONE_IF_ABSENT]
    last_seen_s: Annotated[float, Num(-1e9)]
    penalty: Annotated[float, Wire(absent=0.0)]
    metrics: Annotated[PeerMetrics | None, NONE_IF_ABSENT]
    health: Health | None = None  # its worker's health as the peer reports it (None: unknown)
    stage_compute: StageCompute | None = None  # its worker's timed stage (None: not yet)
    # its own dial-back verdict, from its peer record
    reachability: Annotated[str, OneOf(REACHABILITY)] = "unknown"
    # behind a NAT: the peers holding relay slots for it
    relays: Annotated[tuple[str, ...], PeerIds(MAX_RELAYS)] = ()
    # its protocol level (records/peer.py PROTOCOL_LEVEL; None: a peer of before the field)
    protocol: Annotated[
        int | None, Nullable(Int(1, MAX_PROTOCOL_LEVEL)), Wire(omit_default=True)
    ] = None

    def to_dict(self) -> dict[str, Any]:
        items = list(super().to_dict().items())
        # derived from metrics, for readers: "resumed from step N (lineage ...)"
        started = "" if self.metrics is None else self.metrics.started
        items.insert([k for k, _ in items].index("metrics") + 1, ("started", started))
        return dict(items)


@dataclass(frozen=True)
class LinkStatus(Record, name="status link"):
    a: Annotated[str, PeerId()]
    b: Annotated[str, PeerId()]
    rtt_ms: Annotated[float | None, NONE_IF_ABSENT]
    bandwidth_mbps: Annotated[float | None, NONE_IF_ABSENT]
    age_s: float
    # CONNECTIONS: direct, holepunched or relayed
    connection: Annotated[str, OneOf(CONNECTIONS)] = "direct"
    # nobody measured it: predicted from its ends' coordinates and capacities (issue 29); absent
    # from a measured link's JSON, which stays as it was
    estimated: Annotated[bool, Wire(omit_default=True)] = False


@dataclass(frozen=True)
class PlanSummary(Record, name="status plan"):
    """The plan without its addresses."""

    term: int
    epoch: int
    planner: Annotated[str, PeerId()]
    stages: Annotated[int, Int(1, MAX_STAGES)]
    pipelines: Annotated[tuple[tuple[str, ...], ...], Seq(PeerIds())]
    spares: Annotated[tuple[str, ...], PeerIds()]
    cost_s: Annotated[float, Wire(absent=0.0)]
    stage_layers: StageLayers = ()  # blocks per stage of an uneven split (empty: even)
    reason: Reason = ""  # why it was made (records/plan.py: PLAN_REASONS)
    previous_cost_s: float | None = None  # the plan it replaced, priced on the same links
    predicted_step_s: float | None = None  # the planner's simulated step
    # the spares that stay only to hand their stage over (control/handover.py)
    donors: Annotated[tuple[str, ...], PeerIds(), OMITTED] = ()

    def wire_problem(self) -> str | None:
        if self.stage_layers and len(self.stage_layers) != self.stages:
            return "stage_layers must be empty or list one count per stage"
        return placement_problem(self.stages, self.pipelines, self.spares, self.donors)

    @classmethod
    def of(cls, plan: Plan) -> PlanSummary:
        return cls(
            plan.term,
            plan.epoch,
            plan.planner,
            plan.stages,
            plan.pipelines,
            plan.spares,
            plan.cost_s,
            plan.stage_layers,
            plan.reason,
            plan.previous_cost_s,
            plan.predicted_step_s,
            plan.donors,
        )


@dataclass(frozen=True)
class SwarmStatus(Record, name="status"):
    run: Annotated[str, Text(empty=True)]
    planner: Annotated[str | None, Nullable(PeerId())]  # the live planner this node follows
    peers: Annotated[tuple[PeerStatus, ...], Seq(Nested(PeerStatus), MAX_STATUS_PEERS)]
    links: Annotated[tuple[LinkStatus, ...], Seq(Nested(LinkStatus), MAX_STATUS_LINKS)]
    plan: PlanSummary | None
    observed_by: Annotated[str, PeerId()]
    # whose telemetry this node holds, and its age
    telemetry_age_s: Annotated[dict[str, float], Map(Num(-1e9), MAX_STATUS_PEERS), Wire(absent={})]
    bootstrap: Annotated[str | None, Nullable(PeerId()), NONE_IF_ABSENT]
    term: int
    relay_bytes: int = 0  # what the observing node relayed for NATed peers, both ways
    # what the observing node waits for (control/waiting.py): a kind of WAIT_KINDS ("": it
    # trains, or the swarm does) and the same in words; finished: the run's last step is
    # trained. Older nodes do not say; a kind we do not know yet is shown as it is
    waiting: Annotated[str, Text(MAX_WAIT_KIND_CHARS, empty=True)] = ""
    waiting_for: Annotated[str, Text(MAX_WAIT_CHARS, empty=True)] = ""
    finished: bool = False
    # what the document leaves out to stay within MAX_STATUS_PEERS and MAX_STATUS_LINKS (the
    # plan's peers and links are always in): a flood of identities, or members naming others
    peers_left_out: Annotated[int, Int(0, 2**53), Wire(omit_default=True)] = 0
    links_left_out: Annotated[int, Int(0, 2**53), Wire(omit_default=True)] = 0
    # the run's `steps` (its last step is steps - 1): what bounds a trainer's word of its step
    # on the dashboard. Older nodes do not say
    run_steps: Annotated[int | None, Nullable(Int(1, 2**53)), Wire(omit_default=True)] = None
