"""A discrete-event simulation of the control plane at scale, in one process, no sockets.

Every peer runs the bounded measurement of control/estimate/: one round-trip probe a second and
a rate probe now and then to a peer of its neighbour set (nearest by coordinate, random, plan
partners), a Vivaldi update per round trip, a capacity estimate from its transfers. Every few
seconds it sends its telemetry (coordinate, capacity, its neighbours' measurements: records
of records/) to the planner candidates only, not to the swarm. Every SYNC_INTERVAL_S it syncs
with a random peer as control/sync.py does: a request with its digests (control/held.py), the
responder's own record, and the buckets that differ (those of the changes still in flight). The candidates are real
SwarmViews (control/view.py, clock injected), holding real tokens: the election (claims, terms,
liveness) and plan acceptance are the product's own code. Message sizes are those of the real
records, signed as the wire signs them (control/wire.py).

Flooded messages are charged as GossipSub charges them: each peer sends and receives about
MESH_DEGREE - 1 copies, and a flood crosses log(N) hops. They come at the live cadences of
control/publishing.py: a joiner's record, every member's unchanged record every record_renew_s,
the planner's claim and plan (faster until the plan stood STEADY_AFTER_S), the organiser's run
spec and record. The starting swarm's own records are not charged: a swarm forms once.
The probes are control_sim_probes.py's, the periodic messages control_sim_cadences.py's.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from functools import partial
from typing import Any

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.candidacy import should_claim
from p2ptrain.control.gossip import MESH_DEGREE
from p2ptrain.control.sync_partners import SYNC_INTERVAL_S
from p2ptrain.control.term_learning import anchor_term
from p2ptrain.control.view import SwarmView
from p2ptrain.harness.control_sim_cadences import Cadences, measured_sizes, wire_bytes
from p2ptrain.harness.control_sim_probes import Probes
from p2ptrain.harness.control_sim_state import Counters, SimPeer
from p2ptrain.harness.control_truth import Truth
from p2ptrain.records import Claim, LinkReport, PeerRecord, Plan, RunSpec, Telemetry
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate
from p2ptrain.records.token import issue_token

TELEMETRY_INTERVAL_S = 4.0  # to the candidates only: also their proof that the peer lives
ELECTION_TICK_S = 0.5
NUM_CANDIDATES = 5  # planner-token holders
HOP_PROCESSING_S = 0.005


class Simulation:
    """The swarm, the event queue and the measured sizes; the bench (control_bench.py) drives
    its phases (first plan, failover) through `run_until` and the hooks."""

    def __init__(self, num_peers: int, seed: int = 0, run: RunSpec | None = None) -> None:
        self.truth = Truth(seed)
        self.rng = random.Random(seed)
        self.now = 0.0
        self.peers: list[SimPeer] = []
        self.counters = Counters()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._num_events = 0
        self._keys = random.Random(f"keys/{seed}")
        self.organiser = self._keys.randbytes(32)
        self.run = run or RunSpec().replace(
            run_id="bench-control", stages=8, n_layer=24, min_peers=max(1, num_peers // 2)
        )
        self.candidates: list[SimPeer] = []
        self.books: dict[int, dict[int, tuple[NetCoordinate, AccessCapacity]]] = {}
        self.left_at: dict[int, float] = {}
        self.sizes = measured_sizes(self.run)
        self.cadences = Cadences(self)  # the live protocol's periodic messages
        self.probes = Probes(self)  # each peer's round-trip and rate probes
        self.at(0.0, self.cadences.organiser_tick)
        for i in range(num_peers):
            self.add_peer(i < NUM_CANDIDATES, at=self.rng.uniform(0.0, 5.0))
        for peer in self.peers:
            self.cadences.schedule_renewals(peer)

    def plan_bytes(self, plan: Plan) -> int:
        """The plan's envelope as the wire would carry it."""
        return wire_bytes(plan.to_dict()) + 200  # header, signature

    # ---------------------------------------------------------------- events

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._num_events += 1
        heapq.heappush(self._queue, (when, self._num_events, action))

    def run_until(self, until: float, stop: Callable[[], bool] = lambda: False) -> None:
        while self._queue and self._queue[0][0] <= until and not stop():
            when, _, action = heapq.heappop(self._queue)
            self.now = when
            action()
        if not stop():
            self.now = max(self.now, until)

    def flood_s(self) -> float:
        """How long a flood takes to reach every peer: log(N) mesh hops of a median one-way delay."""
        return self.hops() * (self.median_one_way_s + HOP_PROCESSING_S)

    def hops(self) -> int:
        """How many mesh hops a flood crosses to reach every peer."""
        return math.ceil(math.log(max(2, self.num_alive())) / math.log(MESH_DEGREE - 1))

    median_one_way_s = 0.06
    median_rate_mbps = 20.0

    def flood(self, num_bytes: float, kind: str) -> None:
        for peer in self.peers:
            if peer.alive:
                self.counters.charge(
                    peer.index, 2 * (MESH_DEGREE - 1) * num_bytes, 2 * (MESH_DEGREE - 1), kind
                )

    def num_alive(self) -> int:
        return sum(p.alive for p in self.peers)

    def alive_indices(self) -> list[int]:
        return [p.index for p in self.peers if p.alive]

    # ---------------------------------------------------------------- membership

    def add_peer(self, candidate: bool = False, at: float | None = None) -> SimPeer:
        index = self.truth.add_peer()
        # keys from the run's seed: a run's ids, hence its election and plan, repeat for a seed
        seed = self._keys.randbytes(32) if candidate else b""
        peer_id = identity.peer_id_of(seed) if candidate else f"sim{index:06d}"
        when = self.now if at is None else at
        peer = SimPeer(index, peer_id, when, random.Random(self.rng.random()), seed=seed)
        self.peers.append(peer)
        if candidate:
            self._make_candidate(peer)
        for other in self.candidates:
            if other is not peer and other.view is not None:
                self._accept(other, peer, "peer", self._record(peer))
        if self.now > 0:  # a newcomer: its record floods, its first sync pulls every bucket
            self.flood(self.sizes["peer"], "peer")
            self.cadences.changed(self.sizes["peer"])
            pulled = self.num_alive() * self.sizes["peer"] + self.cadences.plan_bytes_now()
            responder = self.rng.choice(self.alive_indices())
            for end in (index, responder):
                self.counters.charge(end, pulled, 1 + pulled / (192 * 1024), "sync")
        self.at(when + self.rng.uniform(0, 1), lambda: self.probes.rtt_tick(peer))
        self.at(when + self.rng.uniform(1, 3), lambda: self.probes.rate_tick(peer))
        self.at(
            when + self.rng.uniform(0, TELEMETRY_INTERVAL_S), lambda: self._telemetry_tick(peer)
        )
        self.at(when + self.rng.uniform(0, SYNC_INTERVAL_S), lambda: self.cadences.sync_tick(peer))
        if self.now > 0:
            self.cadences.schedule_renewals(peer)
        return peer

    def _record(self, peer: SimPeer) -> PeerRecord:
        token = None
        if peer.view is not None:
            token = issue_token(self.organiser, peer.peer_id, True, 4e9, self.run.run_id)
        # a fresh run's trainer: its worker holds no saved state of the run
        return PeerRecord((), "trainer", peer.view is not None, "0.1.0", {}, token=token, saved=())

    def _make_candidate(self, peer: SimPeer) -> None:
        view = SwarmView(
            self_id=peer.peer_id,
            role="trainer",
            planner_capable=True,
            started_at=peer.joined_at,
            bootstrap_id=identity.peer_id_of(self.organiser),
            run=self.run,
            own_token=issue_token(self.organiser, peer.peer_id, True, 4e9, self.run.run_id),
        )
        anchor_term(view, 0)
        peer.view = view
        self.candidates.append(peer)
        for other in self.peers:
            if other is not peer:
                self._accept(peer, other, "peer", self._record(other))
        self.at(peer.joined_at + ELECTION_TICK_S, lambda: self._election_tick(peer))

    def remove_peer(self, peer: SimPeer) -> None:
        peer.alive = False
        self.left_at[peer.index] = self.now

    def _accept(self, receiver: SimPeer, author: SimPeer, kind: str, body: Any) -> None:
        assert receiver.view is not None
        author.seq += 1
        env = wire.Envelope(kind, author.peer_id, author.seq, self.now, body, self.run.run_id)
        receiver.view.accept(env, self.now)

    # ---------------------------------------------------------------- periodic work

    def again(
        self, peer: SimPeer, tick: Callable[[SimPeer], None], interval_s: float, jitter: float = 0
    ) -> bool:
        """Schedule a live peer's next `tick` in interval_s (times 1 ± jitter, from the peer's
        rng); False, nothing scheduled, once the peer left: its periodic work ends with it."""
        if not peer.alive:
            return False
        spread = peer.rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0
        self.at(self.now + interval_s * spread, lambda: tick(peer))
        return True

    # ---------------------------------------------------------------- gossip

    def telemetry_of(self, peer: SimPeer) -> Telemetry:
        """Its neighbours' measurements only: O(neighbours), whatever the swarm's size."""
        row = {}
        for i in (*peer.neighbours, *peer.partners):
            s = peer.links.get(i)
            if s is None or (s.rtt_ms is None and s.bandwidth_mbps is None):
                continue
            row[self.peers[i].peer_id] = LinkReport(
                s.rtt_ms,
                None if s.rtt_at is None else round(self.now - s.rtt_at, 3),
                s.bandwidth_mbps,
                None if s.bandwidth_at is None else round(self.now - s.bandwidth_at, 3),
            )
        return Telemetry(row)

    def _telemetry_tick(self, peer: SimPeer) -> None:
        if not self.again(peer, self._telemetry_tick, TELEMETRY_INTERVAL_S, jitter=0.1):
            return
        telemetry = self.telemetry_of(peer)
        size = self.sizes["telemetry_base"] + len(telemetry.links) * self.sizes["telemetry_link"]
        receivers = [c for c in self.candidates if c.alive and c is not peer]
        self.counters.charge(peer.index, size * len(receivers), len(receivers), "telemetry")
        for candidate in receivers:
            self.counters.charge(candidate.index, size, kind="telemetry")
            self._accept(candidate, peer, "telemetry", telemetry)
            self.book(candidate)[peer.index] = (peer.coord, peer.capacity.capacity(self.now))

    def book(self, candidate: SimPeer) -> dict[int, tuple[NetCoordinate, AccessCapacity]]:
        """What a candidate heard of every peer's coordinate and capacity."""
        return self.books.setdefault(candidate.index, {})

    # ---------------------------------------------------------------- election

    on_planner_tick: Callable[[SimPeer], None] = staticmethod(lambda peer: None)

    def _election_tick(self, peer: SimPeer) -> None:
        if not self.again(peer, self._election_tick, ELECTION_TICK_S):
            return
        view = peer.view
        assert view is not None
        if should_claim(view, self.now):
            term = view.claim()
            self.flood(self.sizes["claim"], "claim")
            self.cadences.changed(self.sizes["claim"])
            arrive = self.now + self.flood_s()
            for other in self.candidates:
                if other is not peer:
                    self.at(arrive, partial(self._deliver_claim, other, peer, term))
        if view.planner == peer.peer_id:
            self.cadences.planner_resends(peer)
            self.on_planner_tick(peer)

    def _deliver_claim(self, receiver: SimPeer, author: SimPeer, term: int) -> None:
        if receiver.alive and author.view is not None and author.view.term == term:
            self._accept(receiver, author, "claim", Claim(term))

    def deliver_plan(self, author: SimPeer, plan: Plan) -> None:
        """A new plan, flooded by the caller: it stands from now, re-sent by its author."""
        self.cadences.new_plan(author, self.plan_bytes(plan))
        for other in self.candidates:
            if other is not author and other.alive:
                self._accept(other, author, "plan", plan)
