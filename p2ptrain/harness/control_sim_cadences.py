"""The sizes of the control plane's messages, and the live protocol's periodic messages in bench control's simulation (control_sim.py), at
control/publishing.py's and control/sync.py's cadences: every member's unchanged record every
record_renew_s, the planner's claim and its plan (re-sent by plan_resend_s), the organiser's run
spec and record, and each peer's digest sync with a random peer: a request with its digests
(control/held.py), the responder's own messages, and the buckets where the two differ, those of
the changes still in flight (a flood that has not reached everyone yet): a large bucket listed
by its entries' fingerprints, then the changed entry asked for by name."""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.authored import INLINE_PLAN_BYTES
from p2ptrain.control.held import NUM_BUCKETS, SMALL_BUCKET
from p2ptrain.control.membership import record_renew_s
from p2ptrain.control.publishing import (
    CLAIM_INTERVAL_S,
    PLAN_REBROADCAST_S,
    RUN_INTERVAL_S,
    STEADY_AFTER_S,
    STEADY_CLAIM_INTERVAL_S,
    STEADY_PLAN_REBROADCAST_S,
    STEADY_RUN_INTERVAL_S,
    plan_resend_s,
)
from p2ptrain.control.sync_partners import SYNC_INTERVAL_S
from p2ptrain.harness.control_sim_state import Counters, SimPeer
from p2ptrain.records import Claim, LinkReport, PeerRecord, Plan, RunSpec, Telemetry
from p2ptrain.records.estimate import NetCoordinate
from p2ptrain.records.replies import SyncRequest

REAL_ID_CHARS = 52  # identity.peer_id_of's, for an Ed25519 key
STREAM_OVERHEAD_BYTES = 120  # a probe's stream: yamux headers, noise tags, protocol negotiation


class Swarm(Protocol):
    """What Cadences uses of the simulation (control_sim.py's Simulation)."""

    now: float
    sizes: dict[str, int]
    rng: random.Random
    peers: list[SimPeer]
    counters: Counters
    median_one_way_s: float
    median_rate_mbps: float

    def at(self, when: float, action: Callable[[], None]) -> None: ...
    def again(
        self, peer: SimPeer, tick: Callable[[SimPeer], None], interval_s: float, jitter: float = 0
    ) -> bool: ...
    def flood(self, num_bytes: float, kind: str) -> None: ...
    def flood_s(self) -> float: ...
    def hops(self) -> int: ...
    def plan_bytes(self, plan: Plan) -> int: ...
    def num_alive(self) -> int: ...
    def alive_indices(self) -> list[int]: ...


def wire_bytes(obj: dict[str, Any]) -> int:
    """`obj` as canonical JSON, every simulated peer's short id ("sim000123") counted at a real
    peer id's length (an Ed25519 peer id: 52 characters)."""
    text = wire._canonical(obj)
    short = text.count(b'"sim') + text.count(b"/p2p/sim")
    return len(text) + short * (REAL_ID_CHARS - len("sim000000"))


def plan_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What a plan delta carries of `new` against `old` (control/plan_delta.py), its header
    aside."""
    old_addrs, new_addrs = old.get("data_addrs", {}), new.get("data_addrs", {})
    return {
        "changed": {k: v for k, v in new.items() if k != "data_addrs" and old.get(k) != v},
        "addrs_set": {p: a for p, a in new_addrs.items() if old_addrs.get(p) != a},
        "addrs_dropped": sorted(p for p in old_addrs if p not in new_addrs),
    }


def measured_sizes(run: RunSpec) -> dict[str, int]:
    """Bytes of each message, encoded and signed as the wire does it."""
    seed = secrets.token_bytes(32)
    author = identity.peer_id_of(seed)
    coord = NetCoordinate((123.45, -67.89, 12.34), 8.5, 0.123).to_dict()
    empty = len(wire.sign(seed, "telemetry", 1, Telemetry({}).to_dict(), run_id=run.run_id))
    report = LinkReport(123.4, 1.5, 456.7, 12.3)
    one_link = len(wire._canonical({"links": {author: report.to_dict()}})) - len(
        wire._canonical({"links": {}})
    )
    record = PeerRecord(
        (f"/ip4/203.0.113.7/tcp/4001/p2p/{author}",),
        "trainer",
        False,
        "0.1.0",
        {},
        data_addrs=(f"/ip4/203.0.113.7/tcp/4002/p2p/{author}",),
        saved=(),
    )
    own = {"coord": coord, "cap": {"up_mbps": 123.45, "down_mbps": 678.9}}
    named = SyncRequest(0, False, keys=((author, "peer"),))
    asked = SyncRequest(0, False, digests=("0" * 16,) * NUM_BUCKETS, asker=author)
    return {
        "sync_request": len(wire._canonical(asked.to_dict())) + STREAM_OVERHEAD_BYTES,
        "keys_request": len(wire._canonical(named.to_dict())) + STREAM_OVERHEAD_BYTES,
        "entry": len(json.dumps([author, "peer", "0" * 16])) + 2,
        "run": len(wire.encode(seed, 1, run, run_id=run.run_id)),
        "telemetry_base": empty + len(wire._canonical(own)),
        "telemetry_link": one_link,
        "claim": len(wire.encode(seed, 1, Claim(3, sees=1000), run_id=run.run_id)),
        "peer": len(wire.encode(seed, 1, record, run_id=run.run_id)),
        "probe": len(wire._canonical({"coord": coord})) + STREAM_OVERHEAD_BYTES,
    }


class Cadences:
    """What the swarm re-sends, and the sync's differences, charged to the simulation."""

    def __init__(self, sim: Swarm) -> None:
        self.sim = sim
        self.in_flight: list[tuple[float, float]] = []  # (when, its bucket's bytes): sync's diffs
        self.standing_plan: tuple[float, float, int] | None = None  # bytes, since, the author
        self._due: dict[tuple[int, str], float] = {}  # (peer, kind) -> when it re-sends next

    def send_plan(self, plan: Plan, previous: Plan | None = None) -> float:
        """Charge a new plan's delivery; how long until all hold it. Small: flooded. Too large
        to gossip: its claim floods, each peer pulls it once (as its changes against the
        `previous` plan, if any: control/plan_delta.py) and serves it about once, a hop a round
        trip and the transfer (control/plan_pull.py)."""
        num_bytes = self.sim.plan_bytes(plan)
        if num_bytes <= INLINE_PLAN_BYTES:
            self.sim.flood(num_bytes, "plan")
            return self.sim.flood_s()
        if previous is not None:
            num_bytes = wire_bytes(plan_changes(previous.to_dict(), plan.to_dict())) + 400
        self.sim.flood(self.sim.sizes["claim"] + 16, "claim")
        for peer in self.sim.peers:
            if peer.alive:
                self.sim.counters.charge(peer.index, 2 * num_bytes, 4, "plan")
        transfer_s = num_bytes * 8 / (self.sim.median_rate_mbps * 1e6)
        return self.sim.flood_s() + self.sim.hops() * (2 * self.sim.median_one_way_s + transfer_s)

    def new_plan(self, author: SimPeer, num_bytes: float) -> None:
        """A plan flooded now: it stands from now, re-sent by its author."""
        self.standing_plan = (num_bytes, self.sim.now, author.index)
        resend_s = plan_resend_s(PLAN_REBROADCAST_S, int(num_bytes))
        self._due[(author.index, "plan")] = self.sim.now + resend_s
        self.changed(num_bytes)

    def changed(self, num_bytes: float) -> None:
        """Something new floods now: until it reached everyone, a sync between a peer that has
        it and one that has not serves its bucket."""
        self.in_flight.append((self.sim.now, num_bytes))

    def bucket_bytes(self, num_bytes: float) -> tuple[float, int]:
        """What a sync moves for one changed entry of `num_bytes` (control/held.py), and in how
        many messages: a small bucket's envelopes; a larger one's entries listed, the entry
        asked for by name and sent."""
        sizes, entries = self.sim.sizes, self.sim.num_alive() / NUM_BUCKETS
        if entries <= SMALL_BUCKET:
            return num_bytes + (entries - 1) * sizes["peer"], 0
        return entries * sizes["entry"] + sizes["keys_request"] + num_bytes, 2

    def plan_bytes_now(self) -> float:
        return 0.0 if self.standing_plan is None else self.standing_plan[0]

    def sync_tick(self, peer: SimPeer) -> None:
        """control/sync.py: a request with our digests; the responder's own messages, and the
        buckets where we differ: those of the changes still in flight."""
        if not self.sim.again(peer, self.sync_tick, SYNC_INTERVAL_S, jitter=0.2):
            return
        other = self.sim.peers[self.sim.rng.choice(self.sim.alive_indices())]
        since = self.sim.now - self.sim.flood_s()
        self.in_flight = [(t, b) for t, b in self.in_flight if t >= since]
        reply, messages = float(self.sim.sizes["peer"]), 2
        for _, num_bytes in self.in_flight:
            moved, more = self.bucket_bytes(num_bytes)
            reply, messages = reply + moved, messages + more
        if self.standing_plan is not None and self.standing_plan[2] == other.index:
            reply += self.sim.sizes["claim"] + self.standing_plan[0]  # the planner's own
        for end in (peer, other):
            charged = self.sim.sizes["sync_request"] + reply
            self.sim.counters.charge(end.index, charged, messages, "sync")

    def schedule_renewals(self, peer: SimPeer) -> None:
        """Its unchanged record's re-statements, at a steady phase (a swarm that ran a while)."""
        renew_s = record_renew_s(self.sim.num_alive())
        self.sim.at(
            peer.joined_at + self.sim.rng.uniform(0, renew_s), lambda: self.record_tick(peer)
        )

    def record_tick(self, peer: SimPeer) -> None:
        """An unchanged record re-stated (control/publishing.py: record_renew_s)."""
        if self.sim.again(
            peer, self.record_tick, record_renew_s(self.sim.num_alive()), jitter=0.05
        ):
            self.sim.flood(self.sim.sizes["peer"], "record")

    def steady(self) -> bool:
        """Has the plan stood STEADY_AFTER_S (control/publishing.py's slower pace)?"""
        return (
            self.standing_plan is not None
            and self.sim.now - self.standing_plan[1] >= STEADY_AFTER_S
        )

    def due_now(self, index: int, kind: str, interval_s: float) -> bool:
        if self.sim.now < self._due.get((index, kind), 0.0):
            return False
        self._due[(index, kind)] = self.sim.now + interval_s
        return True

    def organiser_tick(self) -> None:
        """The organiser's run spec and its record (a non-member's proof of life)."""
        interval_s = STEADY_RUN_INTERVAL_S if self.steady() else RUN_INTERVAL_S
        self.sim.flood(self.sim.sizes["run"] + self.sim.sizes["peer"], "run")
        self.sim.at(self.sim.now + interval_s, self.organiser_tick)

    def planner_resends(self, peer: SimPeer) -> None:
        """The planner's claim and its own plan, re-sent (control/publishing.py)."""
        steady = self.steady()
        claim_s = STEADY_CLAIM_INTERVAL_S if steady else CLAIM_INTERVAL_S
        if self.due_now(peer.index, "claim", claim_s):
            self.sim.flood(self.sim.sizes["claim"], "claim")
        plan = self.standing_plan
        plan_s = STEADY_PLAN_REBROADCAST_S if steady else PLAN_REBROADCAST_S
        if plan is None or plan[2] != peer.index or plan[0] > INLINE_PLAN_BYTES:
            return  # a large plan is named by the claims and pulled (control/plan_pull.py)
        if self.due_now(peer.index, "plan", plan_resend_s(plan_s, int(plan[0]))):
            self.sim.flood(plan[0], "plan")
