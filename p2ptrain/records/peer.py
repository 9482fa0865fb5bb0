"""What peers gossip about themselves: their record, their row of the link matrix with their
training metrics, and the planner's claim of a term. Each travels as the body of a signed
envelope (control/wire.py) and is what the envelope's `kind` names."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from p2ptrain.records import fields as f
from p2ptrain.records.codec import (
    Addrs,
    Custom,
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
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate
from p2ptrain.records.reachability import REACHABILITY
from p2ptrain.records.start import parse_start_lineage, started_text
from p2ptrain.records.token import Token

ROLES = ("trainer", "control-only", "bootstrap", "observer")
MEMBER_ROLES = ("trainer", "control-only")  # the roles a plan may place
MAX_VERSION_CHARS = 32
# What peers must share to be planned together: raised by any change after which nodes of the
# two levels would train one plan differently (choose other start steps, read other frames).
# Peers of before the field state none and are planned with any (docs/protocols.md, "Protocol
# levels": what each level changed).
PROTOCOL_LEVEL = 3
MAX_PROTOCOL_LEVEL = 1_000_000
MAX_TERM = 2**53
MAX_SEES = 1_000_000  # peers a planner may say it sees (a claim's `sees`)
MAX_REASON_CHARS = 160
MAX_DEVICE_CHARS = 80
MAX_COMPUTE_S = 3600.0
# a pass over one row of a block, the embedding or the head takes at least a nanosecond on any
# device (the run's model sets a floor: control/planning/compute.py); 0 claimed every layer
MIN_COMPUTE_S = 1e-9
MAX_MEMORY_BYTES = 2**53  # what the wire carries exactly as a JSON number (8 PiB)
# what a device's memory counts for: more than any GPU or a large server's RAM. A larger
# claim reads as this much (an honest machine with more RAM still joins)
MAX_DEVICE_MEMORY_BYTES = 4 * 2**40
MAX_PRECISION_CHARS = 16
MAX_BLOCK = 1_000_000  # a model's blocks, as stage states count them (records/stage_state.py)
# the copy duties a spare reports (a 64-stage pipeline's, with one spare): ~7 kB of the 64 kB a
# telemetry envelope may take
MAX_COPIES = 64


def _memory_bytes(value: object, record: str, name: str) -> int:
    """A device's memory as it counts for planning (a larger claim reads as the cap)."""
    return min(f.integer(value, record, name, 0, MAX_MEMORY_BYTES), MAX_DEVICE_MEMORY_BYTES)


ComputeSeconds = Annotated[float, Num(MIN_COMPUTE_S, MAX_COMPUTE_S)]
OMITTED = Wire(omit_default=True)


@dataclass(frozen=True)
class StageCompute(Record, name="stage compute"):
    """A worker's measured training time of the run's model on the device that will train:
    seconds per row of a micro-batch, forward + backward, for one transformer block, the
    embedding (first stage) and the head with the loss (last stage); medians of a few timed
    repetitions at `rows` rows (worker/compute_probe.py). The planner prices any stage split
    from it (schedule/compute.py)."""

    block_row_s: ComputeSeconds
    embed_row_s: ComputeSeconds
    head_row_s: ComputeSeconds
    rows: Annotated[int, Int(1, 1_000_000)]
    device: Annotated[str, Text(MAX_DEVICE_CHARS)]
    run_id: str  # the run whose model was timed
    # the memory a stage may use there (the GPU's own, else the machine's; 0: not known) and
    # the precision the passes compute in: the planner gives no peer a stage it cannot hold.
    # Optional: peers of before memory-aware plans do not send them
    memory_bytes: Annotated[int, Custom(_memory_bytes)] = 0
    precision: Annotated[str, Text(MAX_PRECISION_CHARS, empty=True)] = ""


MAX_RELAYS = 4  # relay slots a peer names
CONNECTIONS = ("direct", "holepunched", "relayed")  # how a link's bytes travel


# the saved states a member names (records of its checkpoint directory, the newest first): a
# 64-stage model's, one lineage; ~3 kB of the 64 kB a record's envelope may take
MAX_SAVED = 64
_SAVED_LINEAGE = re.compile(r"[0-9a-f]{16}|root")


def _saved_lineage(value: object, record: str, name: str) -> str:
    if not isinstance(value, str) or not _SAVED_LINEAGE.fullmatch(value):
        raise f.malformed(record, "a saved state's lineage must be a lineage id or 'root'")
    return value


@dataclass(frozen=True)
class SavedStage(Record, name="saved stage"):
    """A stage state this peer's checkpoint directory holds for the run: blocks [first, end),
    the newest step of them saved under `lineage` (a lineage id, "root" for untagged states).
    A restarted swarm's first plan waits, bounded, for the blocks the run's newest lineage saved
    that no member names yet (control/planning/readiness.py): their holder has not joined."""

    first: Annotated[int, Int(0, MAX_BLOCK)]
    end: Annotated[int, Int(1, MAX_BLOCK + 1)]
    step: Annotated[int, Int()]
    lineage: Annotated[str, Custom(_saved_lineage)]

    def __post_init__(self) -> None:
        if self.end <= self.first:
            raise ValueError(f"blocks [{self.first}, {self.end}) hold none")


def _token(value: object, record: str, name: str) -> Token:
    return Token.decode(value)


@dataclass(frozen=True)
class PeerRecord(Record, name="peer"):
    """A peer announces itself: addresses, role, software, hardware, measured compute."""

    addrs: Annotated[tuple[str, ...], Addrs()]  # control-plane multiaddrs
    role: Annotated[str, OneOf(ROLES)]
    planner_capable: bool
    version: Annotated[str, Text(MAX_VERSION_CHARS)]
    # descriptive (control/hardware.py); nothing acts on it
    hardware: Annotated[dict[str, Any], FreeForm()]
    compute_gflops: float | None = None
    # the worker's p2pd multiaddrs, once it said hello
    data_addrs: Annotated[tuple[str, ...], Addrs()] = ()
    # the organiser's word that it may join (and plan): token.py; sent as its text form
    token: Annotated[Token | None, Nullable(Custom(_token, Token.encode)), OMITTED] = None
    # its worker's measurement, once it made one
    stage_compute: Annotated[StageCompute | None, OMITTED] = None
    # can others dial it? its own dial-back verdict (control/reachability.py): REACHABILITY;
    # peers of before the dial-back protocol do not send it
    reachability: Annotated[str, OneOf(REACHABILITY)] = "unknown"
    # its relay port (control/traversal.py), if it serves one
    relay_addrs: Annotated[tuple[str, ...], Addrs()] = ()
    # behind a NAT: the peers holding relay slots for it
    relays: Annotated[tuple[str, ...], PeerIds(MAX_RELAYS)] = ()
    # the organiser's (the bootstrap's) current term, once it knows one: believed of the
    # organiser only, and only fresh (control/intake.py); others leave it out
    term: Annotated[int | None, Nullable(Int(0, MAX_TERM)), OMITTED] = None
    # the organiser's word that a planner-token holder's plan of this run was out (the run is
    # under way: min_peers gated its first plan only); believed of the organiser only
    planned: Annotated[bool, OMITTED] = False
    # a trainer's saved states of the run (SavedStage), once its worker read its directory;
    # None: not yet, or a peer of before this field
    saved: Annotated[
        tuple[SavedStage, ...] | None, Nullable(Seq(Nested(SavedStage), MAX_SAVED)), OMITTED
    ] = None
    # its PROTOCOL_LEVEL: a planner plans only members of its own level, or of none (peers of
    # before the field: plan_inputs.plannable_members)
    protocol: Annotated[int | None, Nullable(Int(1, MAX_PROTOCOL_LEVEL)), OMITTED] = None


MAX_PROBE_FAILURES = 1_000_000
Failures = Annotated[int, Int(0, MAX_PROBE_FAILURES), OMITTED]


@dataclass(frozen=True)
class LinkReport(Record, name="link"):
    """One peer's latest own measurements towards another, with their ages in seconds, and how
    many of its latest probes of each kind failed in a row (the far end refused or did not
    prove the bytes: control/links.py then takes neither end's word for that link). The
    defaults are left out of the object: telemetry stays within its cap."""

    rtt_ms: float | None = None
    rtt_age_s: float | None = None
    bandwidth_mbps: float | None = None
    bandwidth_age_s: float | None = None
    # CONNECTIONS: how the reporter's connection to the peer goes
    connection: Annotated[str, OneOf(CONNECTIONS), OMITTED] = "direct"
    rtt_failures: Failures = 0
    bandwidth_failures: Failures = 0


MAX_OUTCOMES = 8


def _outcome_counts(value: object, record: str, name: str) -> dict[str, int]:
    """Averaging rounds by outcome: a few short names, each a count."""
    d = f.mapping(value, record)
    if len(d) > MAX_OUTCOMES:
        raise f.malformed(record, f"averaging names more than {MAX_OUTCOMES} outcomes")
    return {
        f.text(k, record, "averaging outcome", 16): f.integer(v, record, "averaging count")
        for k, v in d.items()
    }


StartLineage = Annotated[str, Custom(parse_start_lineage)]


def _plan_key_reader(low_term: int) -> Callable[[object, str, str], tuple[int, int]]:
    """A reader of a plan's (term, epoch), written [term, epoch], its term at least `low_term`."""

    def read(value: object, record: str, name: str) -> tuple[int, int]:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise f.malformed(record, f"{name} must be [term, epoch]")
        term = f.integer(value[0], record, name, low_term, MAX_TERM)
        return (term, f.integer(value[1], record, name, 0))

    return read


_plan_key = _plan_key_reader(1)  # an elected planner's
_any_plan_key = _plan_key_reader(0)  # term 0 too: a plan made without an election


@dataclass(frozen=True)
class StageCopy(Record, name="stage copy"):
    """One copy duty of a spare (worker/resume/copies.py): the blocks [first, end) that `holder`
    alone trains, and the step of the spare's newest copy of them (None: none yet)."""

    first: Annotated[int, Int(0, MAX_BLOCK)]
    end: Annotated[int, Int(1, MAX_BLOCK + 1)]
    holder: Annotated[str, PeerId()]
    step: Annotated[int | None, Nullable(Int())] = None

    def __post_init__(self) -> None:
        if self.end <= self.first:
            raise ValueError(f"blocks [{self.first}, {self.end}) hold none")

    @property
    def layers(self) -> str:
        """ "L0-2", as checkpoint files and logs name them."""
        return f"L{self.first}-{self.end}"


MAX_SILENT = 64  # silent members one report names (a telemetry envelope is <= 64 KiB)


@dataclass(frozen=True)
class PeerMetrics(Record, name="metrics"):
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
    averaging: Annotated[dict[str, int] | None, Nullable(Custom(_outcome_counts))] = None
    # the control plane's own traffic (probes, RPCs, sync; not gossip or the DHT), cumulative
    control_bytes_sent: int | None = None
    control_bytes_received: int | None = None
    relay_bytes: int | None = None  # what its relay moved for NATed peers, cumulative
    # where its worker's session started (issue 30; records/start.py): the first step (None:
    # not known), the lineage of the state it resumed ("root" untagged, "" initial weights),
    # and whether it started fresh because the run says resume = "never"; peers of before
    # issue 30 do not send them
    start_step: int | None = None
    start_lineage: StartLineage = ""
    resume_never: bool = False
    # a spare's copy duties in a plan of one pipeline, how far each copy is, and that plan's
    # (term, epoch): shown only under that plan (from the worker's CopyReport; a trainer has none)
    copies: Annotated[tuple[StageCopy, ...], Seq(Nested(StageCopy), MAX_COPIES), OMITTED] = ()
    copies_plan: Annotated[
        tuple[int, int] | None, Nullable(Custom(_any_plan_key, list)), OMITTED
    ] = None
    # the plan members its worker's start agreement under `silent_plan` heard nothing from
    # (records/messages.py: StartReport; control/planning/silent_start.py judges them)
    silent: Annotated[tuple[str, ...], PeerIds(MAX_SILENT), OMITTED] = ()
    silent_plan: Annotated[
        tuple[int, int] | None, Nullable(Custom(_any_plan_key, list)), OMITTED
    ] = None

    def copies_under(self, plan: tuple[int, int] | None) -> tuple[StageCopy, ...]:
        """The copies this spare reported under `plan` (a plan's (term, epoch)): none if they
        were another plan's (a spare keeps them until its next report)."""
        return self.copies if plan is not None and self.copies_plan == plan else ()

    @property
    def started(self) -> str:
        """Where the session started, as `status` and the dashboard say it ("": not known)."""
        return started_text(self.start_step, self.start_lineage, self.resume_never)


@dataclass(frozen=True)
class Health(Record, name="health"):
    """Does this node's worker make progress (control/health.py)? The planner plans only peers
    whose health is ok; `reason` says why not, for `status` and the logs."""

    ok: bool
    reason: Annotated[str, Text(MAX_REASON_CHARS, empty=True)] = ""
    # with `left`: the plan (term, epoch) under which the node handed its stage over (None from
    # a peer of before 2026-11-30)
    plan: Annotated[tuple[int, int] | None, Nullable(Custom(_any_plan_key, list)), OMITTED] = None

    def wire_problem(self) -> str | None:
        if self.plan is not None and not self.left:
            return "only the word after a hand-over names a plan"
        return None

    @property
    def leaving(self) -> bool:
        """The node said it is stopping (a signal, a finished run): a leave, not a death."""
        return not self.ok and self.reason in (LEAVING_REASON, LEFT_REASON, QUIT_REASON)

    @property
    def left(self) -> bool:
        """The node's last word after a hand-over (control/handover.py): it exits now."""
        return not self.ok and self.reason == LEFT_REASON

    @property
    def quits(self) -> bool:
        """The node's last word when it exits without handing its stage over (a second
        signal, the hand-over's time limit): a planner keeping it as a donor re-issues its plan
        without it at once, instead of waiting for its silence."""
        return not self.ok and self.reason == QUIT_REASON


LEAVING_REASON = "the node is stopping"
LEFT_REASON = "the node has handed its stage over and exits"
QUIT_REASON = "the node exits without handing a stage over"


@dataclass(frozen=True)
class Telemetry(Record, name="telemetry"):
    """A peer's measurements of its neighbours' links (peer id -> its measurements), its
    metrics, the health of its worker (None from a peer that predates it: taken as ok), and its
    network coordinate and access capacity (records/estimate.py; None from an older peer), from
    which the links nobody measured are estimated."""

    links: Annotated[dict[str, LinkReport], Map(Nested(LinkReport))]
    metrics: PeerMetrics | None = None
    health: Annotated[Health | None, OMITTED] = None
    coordinate: Annotated[NetCoordinate | None, Wire(key="coord", omit_default=True)] = None
    capacity: Annotated[AccessCapacity | None, Wire(key="cap", omit_default=True)] = None


@dataclass(frozen=True)
class Claim(Record, name="claim"):
    """A planner claims (and, re-broadcast, keeps) a term; `plan`: the key of its plan when
    that is too large to gossip whole, which a node lacking it pulls from whoever sent it
    this claim (control/plan_pull.py); `sees`: how many peers the planner could plan for (0:
    not said), by which candidates judge its sight (control/planner_sight.py)."""

    term: Annotated[int, Int(1, MAX_TERM)]
    plan: Annotated[
        tuple[int, int] | None, Nullable(Custom(_plan_key, list)), Wire(omit_default=True)
    ] = None
    sees: Annotated[int, Int(0, MAX_SEES), Wire(omit_default=True)] = 0
