"""Each simulated peer's bounded measurement in bench control's simulation (control_sim.py), as
control/estimate/ and control/measuring.py do it live: a round-trip probe a second to a peer of
its neighbour set (nearest by coordinate, random, plan partners) and a Vivaldi update per round
trip; a rate probe now and then (sooner while few rates place its capacity), from which both ends
learn their capacities. A neighbour whose probes keep failing is replaced."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from p2ptrain.control.estimate import coordinates
from p2ptrain.control.estimate.neighbours import ROTATE_RANDOM_S, choose_neighbours
from p2ptrain.control.links import LinkSample
from p2ptrain.control.measuring import probe_bytes
from p2ptrain.harness.control_sim_state import Counters, SimPeer
from p2ptrain.harness.control_truth import Truth

RTT_PROBE_INTERVAL_S = 1.0
RATE_PROBE_INTERVAL_S = 60.0  # steady state; a neighbour without a rate is probed sooner
FIRST_RATE_PROBE_INTERVAL_S = 3.0
MIN_RATES_MEASURED = 4
NUM_SEEN_COORDINATES = 64  # coordinates a peer remembers to pick its nearest from
MAX_NEIGHBOUR_FAILURES = 2  # a neighbour whose probes fail this often is replaced


class ProbedSwarm(Protocol):
    """What Probes uses of the simulation (control_sim.py's Simulation)."""

    now: float
    sizes: dict[str, int]
    rng: random.Random
    peers: list[SimPeer]
    counters: Counters
    truth: Truth

    def again(
        self, peer: SimPeer, tick: Callable[[SimPeer], None], interval_s: float, jitter: float = 0
    ) -> bool: ...
    def alive_indices(self) -> list[int]: ...


class Probes:
    """The peers' round-trip and rate probes, scheduled on and charged to the simulation."""

    def __init__(self, sim: ProbedSwarm) -> None:
        self.sim = sim

    def rtt_tick(self, peer: SimPeer) -> None:
        if not self.sim.again(peer, self.rtt_tick, RTT_PROBE_INTERVAL_S, jitter=0.2):
            return
        if (
            not peer.neighbours
            or peer.rotation <= (self.sim.now - peer.joined_at) // ROTATE_RANDOM_S
        ):
            self.refresh_neighbours(peer)
        if not peer.neighbours:
            return
        target = self.sim.peers[peer.neighbours[peer.next_probe % len(peer.neighbours)]]
        peer.next_probe += 1
        self.sim.counters.charge(peer.index, 2 * self.sim.sizes["probe"], 2, "probe")
        sample = peer.links.setdefault(target.index, LinkSample())
        rtt = (
            self.sim.truth.sample_rtt_ms(peer.index, target.index, peer.rng)
            if target.alive
            else None
        )
        if rtt is None:
            sample.num_failures += 1
            if sample.num_failures >= MAX_NEIGHBOUR_FAILURES:
                peer.links.pop(target.index, None)
                peer.seen.pop(target.index, None)
                self.refresh_neighbours(peer)
            return
        self.sim.counters.charge(target.index, 2 * self.sim.sizes["probe"], 2, "probe")
        sample.add_rtt(rtt, self.sim.now)
        sample.num_failures = 0
        assert sample.rtt_ms is not None
        # the filtered round trip (least of the recent ones): queueing is not distance
        peer.coord = coordinates.update(peer.coord, target.coord, sample.rtt_ms, peer.rng)
        for a, b in ((peer, target), (target, peer)):
            a.seen[b.index] = b.coord
            if len(a.seen) > NUM_SEEN_COORDINATES:
                del a.seen[next(iter(a.seen))]

    def refresh_neighbours(self, peer: SimPeer) -> None:
        """A new neighbour set: nearest among the coordinates seen, random from the membership."""
        alive = self.sim.alive_indices()
        peer.rotation = int((self.sim.now - peer.joined_at) // ROTATE_RANDOM_S) + 1
        members = {
            self.sim.peers[i].peer_id: i for i in self.sim.rng.sample(alive, min(64, len(alive)))
        }
        predicted = {}
        for i, coord in peer.seen.items():
            if self.sim.peers[i].alive:
                members[self.sim.peers[i].peer_id] = i
                predicted[self.sim.peers[i].peer_id] = peer.coord.distance_ms(coord)
        for i, sample in peer.links.items():  # a measured round trip beats a predicted one
            if sample.rtt_ms is not None and self.sim.peers[i].alive:
                members[self.sim.peers[i].peer_id] = i
                predicted[self.sim.peers[i].peer_id] = sample.rtt_ms
        for i in peer.partners:
            members[self.sim.peers[i].peer_id] = i
        chosen = choose_neighbours(
            peer.peer_id,
            members,
            predicted,
            [self.sim.peers[i].peer_id for i in peer.partners],
            seed=peer.rotation,
        )
        peer.neighbours = tuple(members[p] for p in chosen)

    def rate_tick(self, peer: SimPeer) -> None:
        unmeasured = [
            i
            for i in peer.neighbours
            if (s := peer.links.get(i)) is None or s.bandwidth_mbps is None
        ]
        num_rates = sum(s.bandwidth_mbps is not None for s in peer.links.values())
        # fast until a few rates place its capacity, then a neighbour now and then
        fast = num_rates < MIN_RATES_MEASURED
        interval = FIRST_RATE_PROBE_INTERVAL_S if fast else RATE_PROBE_INTERVAL_S
        if not self.sim.again(peer, self.rate_tick, interval, jitter=0.2):
            return
        if not peer.neighbours:
            return
        if unmeasured:
            target_index = unmeasured[0]
        else:
            target_index = min(peer.neighbours, key=lambda i: peer.links[i].bandwidth_at or 0.0)
        self.measure_rate(peer, self.sim.peers[target_index])

    def measure_rate(self, peer: SimPeer, target: SimPeer) -> None:
        """One rate probe from `peer` to `target`: both ends learn their capacities from it."""
        sample = peer.links.setdefault(target.index, LinkSample())
        num_bytes = probe_bytes(sample.bandwidth_mbps, (sample.rtt_ms or 0.0) / 1e3)
        self.sim.counters.probe_bytes[peer.index] = (
            self.sim.counters.probe_bytes.get(peer.index, 0) + num_bytes
        )
        self.sim.counters.charge(peer.index, self.sim.sizes["probe"], 2, "probe")
        if not target.alive:
            sample.rate_failures += 1
            return
        self.sim.counters.probe_bytes[target.index] = (
            self.sim.counters.probe_bytes.get(target.index, 0) + num_bytes
        )
        mbps = self.sim.truth.sample_rate_mbps(peer.index, target.index, peer.rng)
        if mbps is None:
            sample.rate_failures += 1
            return
        # the prober's row holds its sending direction; the pair's other direction is the far
        # end's to measure (control/links.py takes the slower of the two ends' words)
        sample.add_bandwidth(mbps, self.sim.now)
        peer.capacity.observe(mbps, self.sim.now, sending=True)
        target.capacity.observe(mbps, self.sim.now, sending=False)

    def measure_rtt(self, peer: SimPeer, target: SimPeer) -> None:
        """One round-trip probe outside the schedule (a plan's link confirmed)."""
        rtt = self.sim.truth.sample_rtt_ms(peer.index, target.index, peer.rng)
        self.sim.counters.charge(peer.index, 2 * self.sim.sizes["probe"], 2, "probe")
        if rtt is not None and target.alive:
            peer.links.setdefault(target.index, LinkSample()).add_rtt(rtt, self.sim.now)
