"""The messages between a node's control process and its worker (a Unix socket, one JSON object
per line, ipc_lines.py), and the worker's reports that `p2ptrain local` follows in metrics logs.

worker -> control: `hello` once its data plane is up, `metrics` after every step, `heartbeat`
every few seconds from its own thread (what it is doing and the step it is at: its control process
judges its health from them, control/health.py), `compute` once it timed the run's model,
`copies` on a spare when its plan starts and after each copy (worker/resume/copies.py), `saved`
once it read its checkpoint directory for a run spec (worker/resume/saved_report.py).
control -> worker: `run` (the run spec), `plan` (the accepted plan and the run spec), `stop`.
Metrics logs (`join --metrics-log`) carry `metrics` and `copies`, and also `session`: a plan the
worker started training on, and with `join --profile` a `profile` (records/profile.py) after
each step's metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from p2ptrain.records import fields as f
from p2ptrain.records.codec import (
    Addrs,
    Int,
    Map,
    Nested,
    OneOf,
    PeerId,
    PeerIds,
    Record,
    Seq,
    Text,
    Wire,
)
from p2ptrain.records.peer import (
    MAX_COPIES,
    MAX_SAVED,
    MAX_SILENT,
    SavedStage,
    StageCompute,
    StageCopy,
    StartLineage,
)
from p2ptrain.records.plan import Plan
from p2ptrain.records.profile import StepProfile
from p2ptrain.records.run import RunSpec

AVERAGING_OUTCOMES = ("solo", "averaged", "local", "stopped")
# what a step's DiLoCo outer round did: none, started (applied a few steps later), or as above
OUTER_ROUNDS = ("", "started", *AVERAGING_OUTCOMES)
# what a worker is doing: starting its data plane, waiting for a plan it can train on, joining a
# plan's session (connect, agree on the start step, fetch state), training, idle as a spare
PHASES = ("starting", "waiting", "joining", "training", "spare")
MAX_PID = 2**31


OMITTED = Wire(omit_default=True)


@dataclass(frozen=True)
class Hello(Record, name="hello", kind="hello"):
    """The worker is up: its peer id (the node's) and its data-plane addresses."""

    peer_id: Annotated[str, PeerId()]
    data_addrs: Annotated[tuple[str, ...], Addrs()]
    pid: Annotated[int, Int(0, MAX_PID)]


Count = Annotated[int, Wire(required=True)]


@dataclass(frozen=True)
class LinkBytes(Record, name="link bytes"):
    """Data-plane bytes this worker sent to and received from one peer, since it started."""

    sent: Count = 0
    received: Count = 0


@dataclass(frozen=True)
class MetricsReport(Record, name="metrics", kind="metrics"):
    """One step of one worker. `loss` only on a pipeline's last stage.

    The byte counters are cumulative since the worker started (application bytes of the data
    plane: pipeline frames, averaging parts and metadata, stage-state transfers), in total and
    per peer; `group_size`: how many replicas the gradient was averaged over (1: not averaged).
    Reports of older workers lack them: zeros, and `group_size` None."""

    step: int
    loss: float | None
    tokens_per_s: float
    stage: int
    replica: int
    samples: int  # the replica's rows of the global batch
    averaging: Annotated[str, OneOf(AVERAGING_OUTCOMES)]
    step_s: float
    epoch: int  # the plan it trained under
    term: int
    num_replicas: int
    bytes_sent: int = 0
    bytes_received: int = 0
    link_bytes: Annotated[dict[str, LinkBytes], Map(Nested(LinkBytes))] = dataclasses.field(
        default_factory=dict
    )
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
    start_lineage: StartLineage = ""
    resume_never: bool = False
    # sync = "diloco" (worker/averaging/outer_rounds.py): the stage's outer steps so far and H
    # (None under sync = "step"), and what this step's outer round did ("": none touched it)
    outer_steps: int | None = None
    inner_steps: int | None = None
    outer_round: Annotated[str, OneOf(OUTER_ROUNDS)] = ""

    @property
    def plan_key(self) -> tuple[int, int]:
        return self.term, self.epoch


@dataclass(frozen=True)
class Heartbeat(Record, name="heartbeat", kind="heartbeat"):
    """The worker lives (sent every few seconds from its own thread): its phase and step, and
    the plan it works under ((0, 0): none)."""

    phase: Annotated[str, OneOf(PHASES)]
    step: int
    term: int
    epoch: int


@dataclass(frozen=True)
class ComputeReport(Record, name="compute", kind="compute"):
    """The worker timed a stage of the run's model on its training device (once per run spec)."""

    compute: StageCompute


@dataclass(frozen=True)
class SavedReport(Record, name="saved", kind="saved"):
    """The stage states of run `run_id` the worker's checkpoint directory holds (once per run
    spec, before any plan): its control process names them in its peer record."""

    run_id: Annotated[str, Text(f.MAX_ID_CHARS)]
    saved: Annotated[tuple[SavedStage, ...], Seq(Nested(SavedStage), MAX_SAVED)]


@dataclass(frozen=True)
class CopyReport(Record, name="copies", kind="copies"):
    """A spare's copy duties under the plan (term, epoch) and how far each copy is: sent when
    its plan starts and after each copy (worker/resume/copies.py)."""

    copies: Annotated[tuple[StageCopy, ...], Seq(Nested(StageCopy), MAX_COPIES)]
    term: int
    epoch: int


@dataclass(frozen=True)
class SessionReport(Record, name="session", kind="session"):
    """The worker starts training under `plan` at `step` (metrics logs only)."""

    plan: Plan
    step: int


@dataclass(frozen=True)
class StartReport(Record, name="start report", kind="start"):
    """The worker's start agreement under plan (term, epoch) heard no announcement from these
    members in its time (worker/resume/start_step.py): the control process gossips them with
    its metrics, and the planner plans around a member most of the others name
    (control/planning/silent_start.py)."""

    term: int
    epoch: int
    silent: Annotated[tuple[str, ...], PeerIds(MAX_SILENT)]


# what a session reports to its worker, which passes it on (the metrics log, the IPC)
WorkerReport = MetricsReport | StepProfile | StartReport


@dataclass(frozen=True)
class PlanMessage(Record, name="plan message", kind="plan"):
    """Train under this plan (control -> worker); the run spec travels with it."""

    plan: Plan
    run: Annotated[RunSpec | None, Wire(absent=None)]  # None until the node learnt the run spec
    # peer -> the data-plane addresses to dial it at instead of the plan's: a local route to a
    # peer behind a NAT (control/traversal.py)
    routes: Annotated[Mapping[str, tuple[str, ...]], Map(Addrs()), OMITTED] = dataclasses.field(
        default_factory=dict
    )

    def routed_plan(self) -> Plan:
        """The plan with each routed peer's data addresses replaced by its route."""
        if not self.routes:
            return self.plan
        return dataclasses.replace(self.plan, data_addrs={**self.plan.data_addrs, **self.routes})


@dataclass(frozen=True)
class RunMessage(Record, name="run message", kind="run"):
    """The run spec, as soon as the node learnt it (control -> worker): the worker times the run's
    model before the first plan, so that a compute-aware first plan already knows every peer."""

    run: RunSpec


@dataclass(frozen=True)
class Stop(Record, name="stop", kind="stop"):
    """Checkpoint and exit (control -> worker)."""


Message = (
    Hello
    | MetricsReport
    | Heartbeat
    | ComputeReport
    | SavedReport
    | CopyReport
    | SessionReport
    | StartReport
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
        SavedReport,
        CopyReport,
        SessionReport,
        StartReport,
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


PRECISIONS = ("fp32", "bfloat16", "float16")  # worker/device.py: Precision.name
MAX_CHECK_ERROR_CHARS = 400


@dataclass(frozen=True)
class DeviceFacts(Record, name="device facts"):
    """Where `--device` trains on this machine and in what precision, without and with a loss
    scale (worker/daemon_check.py: device_facts), or why it cannot (`error`)."""

    name: Annotated[str, Text(200, empty=True), OMITTED] = ""
    memory_bytes: Annotated[int, Int(0, 2**62), OMITTED] = 0
    precision: Annotated[str, OneOf(PRECISIONS, empty=True), OMITTED] = ""
    precision_scaled: Annotated[str, OneOf(PRECISIONS, empty=True), OMITTED] = ""
    error: Annotated[str, Text(MAX_CHECK_ERROR_CHARS, empty=True), OMITTED] = ""


@dataclass(frozen=True)
class DaemonCheckReply(Record, name="daemon check"):
    """The last line `python -m p2ptrain.worker.daemon_check` prints for `doctor`: did p2pd start
    (its addresses, its Go settings) or why not, and the device facts."""

    ok: bool
    addrs: Annotated[tuple[str, ...], Seq(Text(f.MAX_ADDR_CHARS), f.MAX_ADDRS), OMITTED] = ()
    p2pd: Annotated[str, Text(4096, empty=True), OMITTED] = ""
    go_runtime: Annotated[dict[str, str], Map(Text(64), 8, key=Text(64)), OMITTED] = (
        dataclasses.field(default_factory=dict)
    )
    error: Annotated[str, Text(MAX_CHECK_ERROR_CHARS, empty=True), OMITTED] = ""
    device: Annotated[DeviceFacts | None, OMITTED] = None

    @classmethod
    def decode(cls, output: bytes) -> DaemonCheckReply:
        """The child's last line of output: a valid reply, or WireError."""
        lines = output.decode(errors="replace").strip().splitlines()
        return cls.from_dict(f.json_value(lines[-1] if lines else "", cls.__name__))


def one_line(text: str) -> str:
    """An error's text as one printable line of a check's reply (tracebacks have newlines)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat[:MAX_CHECK_ERROR_CHARS] or "?"
