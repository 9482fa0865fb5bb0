"""The state the control plane's pieces share: who this node is, what it announces, what it holds.

One explicit object handed to each piece (discovery, gossip, sync, publishing, election, the worker
link) instead of attributes of one node class; each piece reads and writes only the fields it
needs. Everything runs in one trio thread, so no locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import trio
from libp2p.abc import IHost

from p2ptrain.control import wire
from p2ptrain.control.events import Changes
from p2ptrain.control.health import WorkerWatch
from p2ptrain.control.held import HeldEnvelopes
from p2ptrain.control.view import MEMBER_ROLES, SwarmView
from p2ptrain.records import SavedReport, SavedStage, StageCompute
from p2ptrain.traversal.splice import RelayCounters

MIN_REPUBLISH_GAP_S = 1.0  # the least time between two messages of one kind we publish

# what we author (control/authored.py)
Kind = Literal["record", "run", "telemetry", "claim", "plan"]


@dataclass
class NodeState:
    """One control process's shared, mutable state."""

    seed: bytes  # our identity key: signs every envelope we author
    role: str  # "bootstrap", "control-only" or "trainer"
    peer_id: str
    host: IHost
    view: SwarmView
    hardware: dict[str, Any]  # announced in our peer record
    addrs: list[str] = field(default_factory=list)  # our full listen multiaddrs, once listening
    data_addrs: list[str] = field(default_factory=list)  # our worker's, from its hello
    compute_gflops: float | None = None  # measured once, soon after start
    stage_compute: StageCompute | None = None  # our worker's timed stage (ComputeReport)
    saved: SavedReport | None = None  # our worker's states of a run (saved_states)
    reachability: str = "unknown"  # can others dial us? (control/reachability.py)
    relay_addrs: list[str] = field(default_factory=list)  # our relay port (control/traversal.py)
    relays: list[str] = field(default_factory=list)  # behind a NAT: who holds slots for us
    relay: RelayCounters = field(default_factory=RelayCounters)  # what our relay moved
    seq: wire.SeqClock = field(default_factory=wire.SeqClock)  # for every envelope we author
    # kind -> the clock's time our next message of that kind is due, and when we last sent one
    # (see publishing.py)
    due: dict[Kind, float] = field(default_factory=dict)
    sent_at: dict[Kind, float] = field(default_factory=dict)
    # (author, kind) -> the latest envelope we accepted from another peer: served to sync clients
    latest: HeldEnvelopes = field(default_factory=HeldEnvelopes)
    plan_bytes: tuple[int, int] = (-1, 0)  # our own plan's envelope size, by view.plan_version
    joined: trio.Event = field(default_factory=trio.Event)  # set once we are in the swarm
    # the organiser-signed run envelope we joined with (from the bootstrap, a member or our
    # kept file): what we keep to rejoin, and serve a joiner while no fresher one is held
    run_envelope: bytes | None = None
    # set to stop the node: a signal, or nothing left to do (control/run_watch.py)
    stopping: trio.Event = field(default_factory=trio.Event)
    worker: WorkerWatch = field(default_factory=lambda: WorkerWatch(time.monotonic()))
    revocations_path: str | None = None  # the bootstrap's --revoked file, re-read periodically
    revocations_warned: str = ""  # what the last reload of that file skipped (warned once)
    # the node's one clock (monotonic seconds; tests pass trio.current_time to run on MockClock)
    clock: Callable[[], float] = time.monotonic
    changes: Changes = field(default_factory=Changes)  # what the tasks wait for (events.py)

    def newest_run_envelope(self) -> bytes | None:
        """The organiser's run envelope: the latest it published that we accepted (gossip
        re-signs it), else the one we joined with (it ages), else None."""
        return self.latest.get((self.view.bootstrap_id or "", "run")) or self.run_envelope

    def saved_states(self) -> tuple[SavedStage, ...] | None:
        """The run's states our worker said it holds, for our record: once we know the run is
        the one it meant (a restarted control process hears the report before the run)."""
        report, run = self.saved, self.view.run
        if report is None or run is None or report.run_id != run.run_id:
            return None
        return report.saved

    @property
    def is_member(self) -> bool:
        """Trainers and control-only peers: probed, planned, and candidates for planner."""
        return self.role in MEMBER_ROLES

    def publish_soon(self, kind: Kind) -> None:
        """Publish our `kind` message at the publisher's next tick, not at its next interval, but
        not sooner than MIN_REPUBLISH_GAP_S after the last one: a node whose state flaps (an
        election under load, a worker's health) stays well inside the rates that others hold
        it to (control/flood.py), instead of being blocked as a flooder."""
        last = self.sent_at.get(kind)
        self.due[kind] = 0.0 if last is None else last + MIN_REPUBLISH_GAP_S
        self.changes.notify("publish")
