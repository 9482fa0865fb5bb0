"""What peers gossip about themselves: their record, their row of the link matrix with their
training metrics, and the planner's claim of a term. Each travels as the body of a signed
envelope (control/wire.py) and is what the envelope's `kind` names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from p2ptrain.records import fields as f
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate
from p2ptrain.records.reachability import REACHABILITY
from p2ptrain.records.start import parse_start_lineage, started_text
from p2ptrain.records.token import Token

ROLES = ("trainer", "control-only", "bootstrap", "observer")
MEMBER_ROLES = ("trainer", "control-only")  # the roles a plan may place
MAX_VERSION_CHARS = 32
MAX_TERM = 2**53
MAX_REASON_CHARS = 160
MAX_DEVICE_CHARS = 80
MAX_COMPUTE_S = 3600.0
# a pass over one row of a block, the embedding or the head takes at least a nanosecond on any
# device (the run's model sets a higher floor: control/planning/compute.py); 0 claimed every layer
MIN_COMPUTE_S = 1e-9
MAX_MEMORY_BYTES = 2**53  # what the wire carries exactly as a JSON number (8 PiB)
# what a device's memory counts for: more than any GPU or a large server's RAM. A larger
# claim reads as this much (an honest machine with more RAM still joins)
MAX_DEVICE_MEMORY_BYTES = 4 * 2**40
MAX_PRECISION_CHARS = 16


@dataclass(frozen=True)
class StageCompute:
    """A worker's measured training time of the run's model on the device that will train:
    seconds per row of a micro-batch, forward + backward, for one transformer block, the
    embedding (first stage) and the head with the loss (last stage); medians of a few timed
    repetitions at `rows` rows (worker/compute_probe.py). The planner prices any stage split
    from it (schedule/compute.py)."""

    block_row_s: float
    embed_row_s: float
    head_row_s: float
    rows: int
    device: str
    run_id: str  # the run whose model was timed
    # the memory a stage may use there (the GPU's own, else the machine's; 0: not known) and
    # the precision the passes compute in: the planner gives no peer a stage it cannot hold
    memory_bytes: int = 0
    precision: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> StageCompute:
        r = "stage compute"
        d = f.mapping(data, r)
        names = ("block_row_s", "embed_row_s", "head_row_s")
        f.require_keys(d, r, (*names, "rows", "device", "run_id"))
        seconds = {n: f.number(d[n], r, n, MIN_COMPUTE_S, MAX_COMPUTE_S) for n in names}
        return cls(
            rows=f.integer(d["rows"], r, "rows", 1, 1_000_000),
            device=f.text(d["device"], r, "device", MAX_DEVICE_CHARS),
            run_id=f.text(d["run_id"], r, "run_id"),
            # optional: peers of before memory-aware plans do not send them
            memory_bytes=min(
                f.integer(d.get("memory_bytes", 0), r, "memory_bytes", 0, MAX_MEMORY_BYTES),
                MAX_DEVICE_MEMORY_BYTES,
            ),
            precision=f.text(d["precision"], r, "precision", MAX_PRECISION_CHARS)
            if d.get("precision", "") != ""
            else "",
            **seconds,
        )


MAX_RELAYS = 4  # relay slots a peer names
CONNECTIONS = ("direct", "holepunched", "relayed")  # how a link's bytes travel


@dataclass(frozen=True)
class PeerRecord:
    """A peer announces itself: addresses, role, software, hardware, measured compute."""

    addrs: tuple[str, ...]  # control-plane multiaddrs
    role: str
    planner_capable: bool
    version: str
    hardware: dict[str, Any]  # descriptive (control/hardware.py); nothing acts on it
    compute_gflops: float | None = None
    data_addrs: tuple[str, ...] = ()  # the worker's p2pd multiaddrs, once it said hello
    token: Token | None = None  # the organiser's word that it may join (and plan): token.py
    stage_compute: StageCompute | None = None  # its worker's measurement, once it made one
    # can others dial it? its own dial-back verdict (control/reachability.py): REACHABILITY
    reachability: str = "unknown"
    relay_addrs: tuple[str, ...] = ()  # its relay port (control/traversal.py), if it serves one
    relays: tuple[str, ...] = ()  # behind a NAT: the peers holding relay slots for it

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "addrs": list(self.addrs),
            "relay_addrs": list(self.relay_addrs),
            "relays": list(self.relays),
            "data_addrs": list(self.data_addrs),
            "role": self.role,
            "planner_capable": self.planner_capable,
            "version": self.version,
            "hardware": self.hardware,
            "compute_gflops": self.compute_gflops,
            "reachability": self.reachability,
        }
        if self.token is not None:
            data["token"] = self.token.encode()
        if self.stage_compute is not None:
            data["stage_compute"] = self.stage_compute.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: object) -> PeerRecord:
        d = f.mapping(data, "peer")
        f.require_keys(d, "peer", ("addrs", "role", "planner_capable", "version", "hardware"))
        return cls(
            addrs=f.addrs(d["addrs"], "peer", "addrs"),
            role=f.choice(d["role"], "peer", "role", ROLES),
            planner_capable=f.boolean(d["planner_capable"], "peer", "planner_capable"),
            version=f.text(d["version"], "peer", "version", MAX_VERSION_CHARS),
            hardware=f.free_form(d["hardware"], "peer", "hardware"),
            compute_gflops=f.optional_number(d.get("compute_gflops"), "peer", "compute_gflops"),
            data_addrs=f.addrs(d.get("data_addrs", []), "peer", "data_addrs"),
            token=None if d.get("token") is None else Token.decode(d["token"]),
            stage_compute=_optional_compute(d.get("stage_compute")),
            # optional: peers of before the dial-back protocol do not send it
            reachability=f.choice(
                d.get("reachability", "unknown"), "peer", "reachability", REACHABILITY
            ),
            relay_addrs=f.addrs(d.get("relay_addrs", []), "peer", "relay_addrs"),
            relays=f.peer_ids(d.get("relays", []), "peer", "relays", MAX_RELAYS),
        )


def _optional_compute(value: object) -> StageCompute | None:
    return None if value is None else StageCompute.from_dict(value)


MAX_PROBE_FAILURES = 1_000_000


@dataclass(frozen=True)
class LinkReport:
    """One peer's latest own measurements towards another, with their ages in seconds, and how
    many of its latest probes of each kind failed in a row (the far end refused or did not
    prove the bytes: control/links.py then takes neither end's word for that link)."""

    rtt_ms: float | None = None
    rtt_age_s: float | None = None
    bandwidth_mbps: float | None = None
    bandwidth_age_s: float | None = None
    connection: str = "direct"  # CONNECTIONS: how the reporter's connection to the peer goes
    rtt_failures: int = 0
    bandwidth_failures: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # the defaults are left out: telemetry stays within its cap
        for name, default in (("connection", "direct"), *((n, 0) for n in _FAILURE_FIELDS)):
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: object) -> LinkReport:
        d = f.mapping(data, "link")
        values = {k: f.optional_number(d.get(k), "link", k) for k in _LINK_FIELDS}
        connection = f.choice(d.get("connection", "direct"), "link", "connection", CONNECTIONS)
        return cls(
            **values,
            connection=connection,
            rtt_failures=f.integer(
                d.get("rtt_failures", 0), "link", "rtt_failures", 0, MAX_PROBE_FAILURES
            ),
            bandwidth_failures=f.integer(
                d.get("bandwidth_failures", 0), "link", "bandwidth_failures", 0, MAX_PROBE_FAILURES
            ),
        )


_FAILURE_FIELDS = ("rtt_failures", "bandwidth_failures")
_LINK_FIELDS = tuple(
    field.name
    for field in dataclasses.fields(LinkReport)
    if field.name not in ("connection", *_FAILURE_FIELDS)
)


@dataclass(frozen=True)
class PeerMetrics:
    """A trainer's latest step as its control process gossips it (from the worker's reports),
    with its worker's data-plane byte counters (cumulative; None from an older peer)."""

    step: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    stage: int | None = None
    replica: int | None = None
    bytes_sent: int | None = None
    bytes_received: int | None = None
    step_s: float | None = None  # the latest step's wall time
    # averaging rounds since the worker started, by outcome (records/messages.py:
    # AVERAGING_OUTCOMES); None from an older peer
    averaging: dict[str, int] | None = None
    # the control plane's own traffic (probes, RPCs, sync; not gossip or the DHT), cumulative
    control_bytes_sent: int | None = None
    control_bytes_received: int | None = None
    relay_bytes: int | None = None  # what its relay moved for NATed peers, cumulative
    # where its worker's session started (issue 30; records/start.py): the first step (None:
    # not known), the lineage of the state it resumed ("root" untagged, "" initial weights),
    # and whether it started fresh because the run says resume = "never"
    start_step: int | None = None
    start_lineage: str = ""
    resume_never: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def started(self) -> str:
        """Where the session started, as `status` and the dashboard say it ("": not known)."""
        return started_text(self.start_step, self.start_lineage, self.resume_never)

    @classmethod
    def from_dict(cls, data: object) -> PeerMetrics:
        d = f.mapping(data, "metrics")
        return cls(
            step=f.optional_integer(d.get("step"), "metrics", "step"),
            loss=f.optional_number(d.get("loss"), "metrics", "loss"),
            tokens_per_s=f.optional_number(d.get("tokens_per_s"), "metrics", "tokens_per_s"),
            stage=f.optional_integer(d.get("stage"), "metrics", "stage"),
            replica=f.optional_integer(d.get("replica"), "metrics", "replica"),
            bytes_sent=f.optional_integer(d.get("bytes_sent"), "metrics", "bytes_sent"),
            bytes_received=f.optional_integer(d.get("bytes_received"), "metrics", "bytes_received"),
            step_s=f.optional_number(d.get("step_s"), "metrics", "step_s"),
            averaging=_outcome_counts(d.get("averaging")),
            control_bytes_sent=f.optional_integer(
                d.get("control_bytes_sent"), "metrics", "control_bytes_sent"
            ),
            control_bytes_received=f.optional_integer(
                d.get("control_bytes_received"), "metrics", "control_bytes_received"
            ),
            relay_bytes=f.optional_integer(d.get("relay_bytes"), "metrics", "relay_bytes"),
            # optional: peers of before issue 30 do not send them
            start_step=f.optional_integer(d.get("start_step"), "metrics", "start_step"),
            start_lineage=parse_start_lineage(d.get("start_lineage", ""), "metrics"),
            resume_never=f.boolean(d.get("resume_never", False), "metrics", "resume_never"),
        )


MAX_OUTCOMES = 8


def _outcome_counts(value: object) -> dict[str, int] | None:
    """Averaging rounds by outcome: a few short names, each a count."""
    if value is None:
        return None
    d = f.mapping(value, "metrics")
    if len(d) > MAX_OUTCOMES:
        raise f.malformed("metrics", f"averaging names more than {MAX_OUTCOMES} outcomes")
    return {
        f.text(k, "metrics", "averaging outcome", 16): f.integer(v, "metrics", "averaging count")
        for k, v in d.items()
    }


@dataclass(frozen=True)
class Health:
    """Does this node's worker make progress (control/health.py)? The planner plans only peers
    whose health is ok; `reason` says why not, for `status` and the logs."""

    ok: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: object) -> Health:
        d = f.mapping(data, "health")
        f.require_keys(d, "health", ("ok",))
        reason = d.get("reason", "")
        return cls(
            ok=f.boolean(d["ok"], "health", "ok"),
            reason="" if reason == "" else f.text(reason, "health", "reason", MAX_REASON_CHARS),
        )


@dataclass(frozen=True)
class Telemetry:
    """A peer's measurements of its neighbours' links (peer id -> its measurements), its
    metrics, the health of its worker (None from a peer that predates it: taken as ok), and its
    network coordinate and access capacity (records/estimate.py; None from an older peer), from
    which the links nobody measured are estimated."""

    links: dict[str, LinkReport]
    metrics: PeerMetrics | None = None
    health: Health | None = None
    coordinate: NetCoordinate | None = None
    capacity: AccessCapacity | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "links": {peer: link.to_dict() for peer, link in self.links.items()},
            "metrics": None if self.metrics is None else self.metrics.to_dict(),
        }
        if self.health is not None:
            data["health"] = self.health.to_dict()
        if self.coordinate is not None:
            data["coord"] = self.coordinate.to_dict()
        if self.capacity is not None:
            data["cap"] = self.capacity.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: object) -> Telemetry:
        d = f.mapping(data, "telemetry")
        f.require_keys(d, "telemetry", ("links",))
        links = f.mapping(d["links"], "telemetry")
        if len(links) > f.MAX_PEERS:
            raise f.malformed("telemetry", f"links of more than {f.MAX_PEERS} peers")
        metrics, health = d.get("metrics"), d.get("health")
        coord, cap = d.get("coord"), d.get("cap")
        return cls(
            links={
                f.peer_id(peer, "telemetry"): LinkReport.from_dict(link)
                for peer, link in links.items()
            },
            metrics=None if metrics is None else PeerMetrics.from_dict(metrics),
            health=None if health is None else Health.from_dict(health),
            coordinate=None if coord is None else NetCoordinate.from_dict(coord),
            capacity=None if cap is None else AccessCapacity.from_dict(cap),
        )


@dataclass(frozen=True)
class Claim:
    """A planner claims (and, re-broadcast, keeps) a term."""

    term: int

    def to_dict(self) -> dict[str, Any]:
        return {"term": self.term}

    @classmethod
    def from_dict(cls, data: object) -> Claim:
        d = f.mapping(data, "claim")
        f.require_keys(d, "claim", ("term",))
        return cls(f.integer(d["term"], "claim", "term", 1, MAX_TERM))
