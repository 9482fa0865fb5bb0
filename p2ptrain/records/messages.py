"""The messages between a node's control process and its worker (a Unix socket, one JSON object
per line, ipc_lines.py), and the worker's reports that `p2ptrain local` follows in metrics logs.

worker -> control: `hello` once its data plane is up, `metrics` after every step, `heartbeat`
every few seconds from its own thread (what it is doing and the step it is at: its control process
judges its health from them, control/health.py), `compute` once it timed the run's model.
control -> worker: `plan` (the accepted plan and the run spec), `stop`.
Metrics logs (`join --metrics-log`) also carry `session`: a plan the worker started training on,
and with `join --profile` a `profile` (records/profile.py) after each step's metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from p2ptrain.records import fields as f
from p2ptrain.records.peer import StageCompute
from p2ptrain.records.plan import Plan
from p2ptrain.records.profile import StepProfile
from p2ptrain.records.run import RunSpec
from p2ptrain.records.start import parse_start_lineage

AVERAGING_OUTCOMES = ("solo", "averaged", "local", "stopped")
# what a step's DiLoCo outer round did: none, started (applied a few steps later), or as above
OUTER_ROUNDS = ("", "started", *AVERAGING_OUTCOMES)
# what a worker is doing: starting its data plane, waiting for a plan it can train on, joining a
# plan's session (connect, agree on the start step, fetch state), training, idle as a spare
PHASES = ("starting", "waiting", "joining", "training", "spare")
MAX_PID = 2**31


@dataclass(frozen=True)
class Hello:
    """The worker is up: its peer id (the node's) and its data-plane addresses."""

    TYPE: ClassVar[str] = "hello"
    peer_id: str
    data_addrs: tuple[str, ...]
    pid: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "peer_id": self.peer_id,
            "data_addrs": list(self.data_addrs),
            "pid": self.pid,
        }

    @classmethod
    def from_dict(cls, data: object) -> Hello:
        d = f.mapping(data, "hello")
        f.require_keys(d, "hello", ("peer_id", "data_addrs", "pid"))
        return cls(
            peer_id=f.peer_id(d["peer_id"], "hello"),
            data_addrs=f.addrs(d["data_addrs"], "hello", "data_addrs"),
            pid=f.integer(d["pid"], "hello", "pid", 0, MAX_PID),
        )


@dataclass(frozen=True)
class LinkBytes:
    """Data-plane bytes this worker sent to and received from one peer, since it started."""

    sent: int = 0
    received: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "received": self.received}

    @classmethod
    def from_dict(cls, data: object) -> LinkBytes:
        d = f.mapping(data, "link bytes")
        f.require_keys(d, "link bytes", ("sent", "received"))
        return cls(
            sent=f.integer(d["sent"], "link bytes", "sent"),
            received=f.integer(d["received"], "link bytes", "received"),
        )


@dataclass(frozen=True)
class MetricsReport:
    """One step of one worker. `loss` only on a pipeline's last stage.

    The byte counters are cumulative since the worker started (application bytes of the data
    plane: pipeline frames, averaging parts and metadata, stage-state transfers), in total and
    per peer; `group_size`: how many replicas the gradient was averaged over (1: not averaged).
    Reports of older workers lack them: zeros, and `group_size` None."""

    TYPE: ClassVar[str] = "metrics"
    step: int
    loss: float | None
    tokens_per_s: float
    stage: int
    replica: int
    samples: int  # the replica's rows of the global batch
    averaging: str  # one of AVERAGING_OUTCOMES
    step_s: float
    epoch: int  # the plan it trained under
    term: int
    num_replicas: int
    bytes_sent: int = 0
    bytes_received: int = 0
    link_bytes: dict[str, LinkBytes] = dataclasses.field(default_factory=dict)
    group_size: int | None = None
    # seconds of the step: the stage's forward and backward passes (waits for frames left
    # out), clipping and the update, the averaging round (its wall time); older workers: None.
    # Where the CPU went is a StepProfile's (records/profile.py), only with `join --profile`
    forward_s: float | None = None
    backward_s: float | None = None
    update_s: float | None = None
    averaging_s: float | None = None
    # where the session started (issue 30): its first step (None: an older worker), the
    # lineage id of the state it resumed from ("root" for untagged states, "" for initial
    # weights), and whether it started fresh because the run says resume = "never"
    start_step: int | None = None
    start_lineage: str = ""
    resume_never: bool = False
    # sync = "diloco" (worker/averaging/outer_rounds.py): the stage's outer steps so far and H (None under
    # sync = "step"), and what this step's outer round did ("": none touched this step)
    outer_steps: int | None = None
    inner_steps: int | None = None
    outer_round: str = ""

    @property
    def plan_key(self) -> tuple[int, int]:
        return self.term, self.epoch

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: object) -> MetricsReport:
        d = f.mapping(data, "metrics")
        ints = ("step", "stage", "replica", "samples", "epoch", "term", "num_replicas")
        f.require_keys(d, "metrics", (*ints, "loss", "tokens_per_s", "averaging", "step_s"))
        values: dict[str, Any] = {name: f.integer(d[name], "metrics", name) for name in ints}
        links = f.mapping(d.get("link_bytes", {}), "metrics")
        if len(links) > f.MAX_PEERS:
            raise f.malformed("metrics", f"link_bytes of more than {f.MAX_PEERS} peers")
        return cls(
            loss=f.optional_number(d["loss"], "metrics", "loss"),
            tokens_per_s=f.number(d["tokens_per_s"], "metrics", "tokens_per_s"),
            averaging=f.choice(d["averaging"], "metrics", "averaging", AVERAGING_OUTCOMES),
            step_s=f.number(d["step_s"], "metrics", "step_s"),
            bytes_sent=f.integer(d.get("bytes_sent", 0), "metrics", "bytes_sent"),
            bytes_received=f.integer(d.get("bytes_received", 0), "metrics", "bytes_received"),
            link_bytes={
                f.peer_id(peer, "metrics"): LinkBytes.from_dict(count)
                for peer, count in links.items()
            },
            group_size=f.optional_integer(d.get("group_size"), "metrics", "group_size"),
            forward_s=f.optional_number(d.get("forward_s"), "metrics", "forward_s"),
            backward_s=f.optional_number(d.get("backward_s"), "metrics", "backward_s"),
            update_s=f.optional_number(d.get("update_s"), "metrics", "update_s"),
            averaging_s=f.optional_number(d.get("averaging_s"), "metrics", "averaging_s"),
            start_step=f.optional_integer(d.get("start_step"), "metrics", "start_step"),
            start_lineage=parse_start_lineage(d.get("start_lineage", ""), "metrics"),
            resume_never=f.boolean(d.get("resume_never", False), "metrics", "resume_never"),
            outer_steps=f.optional_integer(d.get("outer_steps"), "metrics", "outer_steps"),
            inner_steps=f.optional_integer(d.get("inner_steps"), "metrics", "inner_steps"),
            outer_round=f.choice(d.get("outer_round", ""), "metrics", "outer_round", OUTER_ROUNDS),
            **values,
        )


@dataclass(frozen=True)
class Heartbeat:
    """The worker lives (sent every few seconds from its own thread): its phase and step, and
    the plan it works under ((0, 0): none)."""

    TYPE: ClassVar[str] = "heartbeat"
    phase: str  # one of PHASES
    step: int
    term: int
    epoch: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: object) -> Heartbeat:
        d = f.mapping(data, "heartbeat")
        f.require_keys(d, "heartbeat", ("phase", "step", "term", "epoch"))
        return cls(
            phase=f.choice(d["phase"], "heartbeat", "phase", PHASES),
            step=f.integer(d["step"], "heartbeat", "step"),
            term=f.integer(d["term"], "heartbeat", "term"),
            epoch=f.integer(d["epoch"], "heartbeat", "epoch"),
        )


@dataclass(frozen=True)
class ComputeReport:
    """The worker timed a stage of the run's model on its training device (once per run spec)."""

    TYPE: ClassVar[str] = "compute"
    compute: StageCompute

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "compute": self.compute.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> ComputeReport:
        d = f.mapping(data, "compute")
        f.require_keys(d, "compute", ("compute",))
        return cls(StageCompute.from_dict(d["compute"]))


@dataclass(frozen=True)
class SessionReport:
    """The worker starts training under `plan` at `step` (metrics logs only)."""

    TYPE: ClassVar[str] = "session"
    plan: Plan
    step: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "plan": self.plan.to_dict(), "step": self.step}

    @classmethod
    def from_dict(cls, data: object) -> SessionReport:
        d = f.mapping(data, "session")
        f.require_keys(d, "session", ("plan", "step"))
        return cls(Plan.from_dict(d["plan"]), f.integer(d["step"], "session", "step"))


@dataclass(frozen=True)
class PlanMessage:
    """Train under this plan (control -> worker); the run spec travels with it."""

    TYPE: ClassVar[str] = "plan"
    plan: Plan
    run: RunSpec | None  # None until the node learnt the run spec
    # peer -> the data-plane addresses to dial it at instead of the plan's: a local route to a
    # peer behind a NAT (control/traversal.py)
    routes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "type": self.TYPE,
            "plan": self.plan.to_dict(),
            "run": None if self.run is None else self.run.to_dict(),
        }
        if self.routes:
            data["routes"] = {peer: list(a) for peer, a in self.routes.items()}
        return data

    @classmethod
    def from_dict(cls, data: object) -> PlanMessage:
        r = "plan message"
        d = f.mapping(data, r)
        f.require_keys(d, r, ("plan",))
        run = d.get("run")
        routes = f.mapping(d.get("routes", {}), r)
        if len(routes) > f.MAX_PEERS:
            raise f.malformed(r, f"routes to more than {f.MAX_PEERS} peers")
        return cls(
            Plan.from_dict(d["plan"]),
            None if run is None else RunSpec.from_dict(run),
            {f.peer_id(p, r, "routes"): f.addrs(a, r, "routes") for p, a in routes.items()},
        )

    def routed_plan(self) -> Plan:
        """The plan with each routed peer's data addresses replaced by its route."""
        if not self.routes:
            return self.plan
        return dataclasses.replace(self.plan, data_addrs={**self.plan.data_addrs, **self.routes})


@dataclass(frozen=True)
class RunMessage:
    """The run spec, as soon as the node learnt it (control -> worker): the worker times the run's
    model before the first plan, so that a compute-aware first plan already knows every peer."""

    TYPE: ClassVar[str] = "run"
    run: RunSpec

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "run": self.run.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> RunMessage:
        d = f.mapping(data, "run message")
        f.require_keys(d, "run message", ("run",))
        return cls(RunSpec.from_dict(d["run"]))


@dataclass(frozen=True)
class Stop:
    """Checkpoint and exit (control -> worker)."""

    TYPE: ClassVar[str] = "stop"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE}

    @classmethod
    def from_dict(cls, data: object) -> Stop:
        f.mapping(data, "stop")
        return cls()


Message = (
    Hello
    | MetricsReport
    | Heartbeat
    | ComputeReport
    | SessionReport
    | StepProfile
    | PlanMessage
    | RunMessage
    | Stop
)
MESSAGE_TYPES: dict[str, Any] = {
    kind.TYPE: kind
    for kind in (
        Hello,
        MetricsReport,
        Heartbeat,
        ComputeReport,
        SessionReport,
        StepProfile,
        PlanMessage,
        RunMessage,
        Stop,
    )
}


def message_from_dict(data: object) -> Message:
    """The message a decoded JSON line holds, by its "type"; WireError if it holds none."""
    d = f.mapping(data, "message")
    name = d.get("type")
    kind = MESSAGE_TYPES.get(name) if isinstance(name, str) else None
    if kind is None:
        raise f.malformed("message", "unknown or missing type")
    message: Message = kind.from_dict(d)
    return message
