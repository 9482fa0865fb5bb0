"""The status document: one node's view of the swarm (the status RPC, `p2ptrain status --json`).

Its JSON fields are a contract relied on outside the project: add fields, never rename or drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2ptrain.records import fields as f
from p2ptrain.records.peer import (
    CONNECTIONS,
    MAX_RELAYS,
    ROLES,
    Health,
    PeerMetrics,
    StageCompute,
)
from p2ptrain.records.plan import MAX_STAGES, Plan, parse_reason, parse_stage_layers
from p2ptrain.records.reachability import REACHABILITY

MAX_STATUS_PEERS = 10_000
MAX_WAIT_KIND_CHARS = 32
MAX_WAIT_CHARS = 1000
MAX_STATUS_LINKS = 200_000


@dataclass(frozen=True)
class PeerStatus:
    id: str
    alive: bool
    planner: bool
    role: str
    addrs: tuple[str, ...]
    data_addrs: tuple[str, ...]
    version: str
    hardware: dict[str, Any]
    compute_gflops: float | None
    last_seen_s: float
    penalty: float
    metrics: PeerMetrics | None
    health: Health | None = None  # its worker's health as the peer reports it (None: unknown)
    stage_compute: StageCompute | None = None  # its worker's timed stage (None: not yet)
    reachability: str = "unknown"  # its own dial-back verdict, from its peer record
    relays: tuple[str, ...] = ()  # behind a NAT: the peers holding relay slots for it

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "alive": self.alive,
            "planner": self.planner,
            "role": self.role,
            "addrs": list(self.addrs),
            "data_addrs": list(self.data_addrs),
            "version": self.version,
            "hardware": self.hardware,
            "compute_gflops": self.compute_gflops,
            "last_seen_s": self.last_seen_s,
            "penalty": self.penalty,
            "metrics": None if self.metrics is None else self.metrics.to_dict(),
            # derived from metrics, for readers: "resumed from step N (lineage ...)"
            "started": "" if self.metrics is None else self.metrics.started,
            "health": None if self.health is None else self.health.to_dict(),
            "stage_compute": None if self.stage_compute is None else self.stage_compute.to_dict(),
            "reachability": self.reachability,
            "relays": list(self.relays),
        }

    @classmethod
    def from_dict(cls, data: object) -> PeerStatus:
        r = "status peer"
        d = f.mapping(data, r)
        f.require_keys(d, r, ("id", "alive", "planner", "role", "addrs", "last_seen_s"))
        metrics, health, compute = d.get("metrics"), d.get("health"), d.get("stage_compute")
        return cls(
            id=f.peer_id(d["id"], r),
            alive=f.boolean(d["alive"], r, "alive"),
            planner=f.boolean(d["planner"], r, "planner"),
            role=f.choice(d["role"], r, "role", ROLES),
            addrs=f.addrs(d["addrs"], r, "addrs"),
            data_addrs=f.addrs(d.get("data_addrs", []), r, "data_addrs"),
            version=f.text(d.get("version", "?"), r, "version"),
            hardware=f.free_form(d.get("hardware", {}), r, "hardware"),
            compute_gflops=f.optional_number(d.get("compute_gflops"), r, "compute_gflops"),
            last_seen_s=f.number(d["last_seen_s"], r, "last_seen_s", -1e9),
            penalty=f.number(d.get("penalty", 0.0), r, "penalty"),
            metrics=None if metrics is None else PeerMetrics.from_dict(metrics),
            health=None if health is None else Health.from_dict(health),
            stage_compute=None if compute is None else StageCompute.from_dict(compute),
            reachability=f.choice(
                d.get("reachability", "unknown"), r, "reachability", REACHABILITY
            ),
            relays=f.peer_ids(d.get("relays", []), r, "relays", MAX_RELAYS),
        )


@dataclass(frozen=True)
class LinkStatus:
    a: str
    b: str
    rtt_ms: float | None
    bandwidth_mbps: float | None
    age_s: float
    connection: str = "direct"  # CONNECTIONS: direct, holepunched or relayed
    # nobody measured it: predicted from its ends' coordinates and capacities (issue 29); absent
    # from a measured link's JSON, which stays as it was
    estimated: bool = False

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "a": self.a,
            "b": self.b,
            "rtt_ms": self.rtt_ms,
            "bandwidth_mbps": self.bandwidth_mbps,
            "age_s": self.age_s,
            "connection": self.connection,
        }
        if self.estimated:
            data["estimated"] = True
        return data

    @classmethod
    def from_dict(cls, data: object) -> LinkStatus:
        d = f.mapping(data, "status link")
        f.require_keys(d, "status link", ("a", "b", "age_s"))
        return cls(
            a=f.peer_id(d["a"], "status link"),
            b=f.peer_id(d["b"], "status link"),
            rtt_ms=f.optional_number(d.get("rtt_ms"), "status link", "rtt_ms"),
            bandwidth_mbps=f.optional_number(d.get("bandwidth_mbps"), "status link", "rate"),
            age_s=f.number(d["age_s"], "status link", "age_s"),
            connection=f.choice(
                d.get("connection", "direct"), "status link", "connection", CONNECTIONS
            ),
            estimated=f.boolean(d.get("estimated", False), "status link", "estimated"),
        )


@dataclass(frozen=True)
class PlanSummary:
    """The plan without its addresses."""

    term: int
    epoch: int
    planner: str
    stages: int
    pipelines: tuple[tuple[str, ...], ...]
    spares: tuple[str, ...]
    cost_s: float
    stage_layers: tuple[int, ...] = ()  # blocks per stage of an uneven split (empty: even)
    reason: str = ""  # why it was made (records/plan.py: PLAN_REASONS)
    previous_cost_s: float | None = None  # the plan it replaced, priced on the same links
    predicted_step_s: float | None = None  # the planner's simulated step

    def to_dict(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "epoch": self.epoch,
            "planner": self.planner,
            "stages": self.stages,
            "pipelines": [list(p) for p in self.pipelines],
            "spares": list(self.spares),
            "cost_s": self.cost_s,
            "stage_layers": list(self.stage_layers),
            "reason": self.reason,
            "previous_cost_s": self.previous_cost_s,
            "predicted_step_s": self.predicted_step_s,
        }

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
        )

    @classmethod
    def from_dict(cls, data: object) -> PlanSummary:
        r = "status plan"
        d = f.mapping(data, r)
        f.require_keys(d, r, ("term", "epoch", "planner", "stages", "pipelines", "spares"))
        pipelines = d["pipelines"]
        if not isinstance(pipelines, list) or len(pipelines) > f.MAX_PEERS:
            raise f.malformed(r, "pipelines must be a list")
        stages = f.integer(d["stages"], r, "stages", 1, MAX_STAGES)
        return cls(
            term=f.integer(d["term"], r, "term"),
            epoch=f.integer(d["epoch"], r, "epoch"),
            planner=f.peer_id(d["planner"], r, "planner"),
            stages=stages,
            pipelines=tuple(f.peer_ids(p, r, "pipeline") for p in pipelines),
            spares=f.peer_ids(d["spares"], r, "spares"),
            cost_s=f.number(d.get("cost_s", 0.0), r, "cost_s"),
            stage_layers=parse_stage_layers(d.get("stage_layers", []), stages),
            reason=parse_reason(d.get("reason", ""), r),
            previous_cost_s=f.optional_number(d.get("previous_cost_s"), r, "previous_cost_s"),
            predicted_step_s=f.optional_number(d.get("predicted_step_s"), r, "predicted_step_s"),
        )


@dataclass(frozen=True)
class SwarmStatus:
    run: str
    planner: str | None  # the live planner this node follows
    peers: tuple[PeerStatus, ...]
    links: tuple[LinkStatus, ...]
    plan: PlanSummary | None
    observed_by: str
    telemetry_age_s: dict[str, float]  # whose telemetry this node holds, and its age
    bootstrap: str | None
    term: int
    relay_bytes: int = 0  # what the observing node relayed for NATed peers, both ways
    # what the observing node waits for (control/waiting.py): a kind of WAIT_KINDS ("": it
    # trains, or the swarm does) and the same in words; finished: the run's last step is trained
    waiting: str = ""
    waiting_for: str = ""
    finished: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "planner": self.planner,
            "peers": [p.to_dict() for p in self.peers],
            "links": [link.to_dict() for link in self.links],
            "plan": None if self.plan is None else self.plan.to_dict(),
            "observed_by": self.observed_by,
            "telemetry_age_s": self.telemetry_age_s,
            "bootstrap": self.bootstrap,
            "term": self.term,
            "relay_bytes": self.relay_bytes,
            "waiting": self.waiting,
            "waiting_for": self.waiting_for,
            "finished": self.finished,
        }

    @classmethod
    def from_dict(cls, data: object) -> SwarmStatus:
        r = "status"
        d = f.mapping(data, r)
        f.require_keys(d, r, ("run", "planner", "peers", "links", "plan", "observed_by", "term"))
        peers, links = d["peers"], d["links"]
        if not isinstance(peers, list) or len(peers) > MAX_STATUS_PEERS:
            raise f.malformed(r, f"peers must be a list of at most {MAX_STATUS_PEERS}")
        if not isinstance(links, list) or len(links) > MAX_STATUS_LINKS:
            raise f.malformed(r, f"links must be a list of at most {MAX_STATUS_LINKS}")
        ages = f.mapping(d.get("telemetry_age_s", {}), r)
        if len(ages) > MAX_STATUS_PEERS:
            raise f.malformed(r, "telemetry_age_s is too large")
        planner, bootstrap, plan = d["planner"], d.get("bootstrap"), d["plan"]
        return cls(
            run=d["run"] if d["run"] == "" else f.text(d["run"], r, "run"),
            planner=None if planner is None else f.peer_id(planner, r, "planner"),
            peers=tuple(PeerStatus.from_dict(p) for p in peers),
            links=tuple(LinkStatus.from_dict(link) for link in links),
            plan=None if plan is None else PlanSummary.from_dict(plan),
            observed_by=f.peer_id(d["observed_by"], r, "observed_by"),
            telemetry_age_s={
                f.peer_id(k, r): f.number(v, r, "telemetry_age_s", -1e9) for k, v in ages.items()
            },
            bootstrap=None if bootstrap is None else f.peer_id(bootstrap, r, "bootstrap"),
            term=f.integer(d["term"], r, "term"),
            relay_bytes=f.integer(d.get("relay_bytes", 0), r, "relay_bytes"),
            # optional: older nodes do not say; a kind we do not know yet is shown as it is
            waiting=_optional_text(d.get("waiting", ""), r, "waiting", MAX_WAIT_KIND_CHARS),
            waiting_for=_optional_text(d.get("waiting_for", ""), r, "waiting_for", MAX_WAIT_CHARS),
            finished=f.boolean(d.get("finished", False), r, "finished"),
        )


def _optional_text(value: object, record: str, name: str, max_chars: int) -> str:
    return "" if value == "" else f.text(value, record, name, max_chars)
