"""What one live node knows for estimating links: its own coordinate and capacity, the ones its
peers gossiped, and the neighbour set it measures. Pure, with monotonic time passed in (the
simulator of `p2ptrain bench control` drives the same pieces: coordinates.py, capacity.py,
neighbours.py).

A swarm of at most FULL_MESH_PEERS members measures every link, as it always did: the neighbour
set is everyone, and the first plan waits for every link (control/planning/readiness.py). A
bigger one measures a bounded neighbour set and estimates the rest.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from p2ptrain.control.estimate import coordinates
from p2ptrain.control.estimate.capacity import CapacityTracker
from p2ptrain.control.estimate.neighbours import MAX_PARTNERS, ROTATE_RANDOM_S, choose_neighbours
from p2ptrain.records import Plan
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate

log = logging.getLogger(__name__)

# at most this many members (self included): every link is measured, none estimated
FULL_MESH_PEERS = 16
# a gossiped coordinate older than this is forgotten (members re-send theirs every few seconds)
MAX_COORDINATE_AGE_S = 120.0


def is_full_mesh(num_members: int) -> bool:
    """Does a swarm of `num_members` (self included) measure every link?"""
    return num_members <= FULL_MESH_PEERS


def plan_partners(plan: Plan | None, peer: str) -> tuple[str, ...]:
    """The peers `plan` makes `peer` exchange with (`partners_in` its pipelines)."""
    return () if plan is None else partners_in(plan.pipelines, peer)


def partners_in(pipelines: Sequence[Sequence[str]], peer: str) -> tuple[str, ...]:
    """The peers these pipelines make `peer` exchange with, at most MAX_PARTNERS: its pipeline
    neighbours and its data-parallel ring neighbours (the same stage in the next and previous
    pipelines)."""
    for pipe in pipelines:
        if peer not in pipe:
            continue
        stage = list(pipe).index(peer)
        near = [pipe[s] for s in (stage - 1, stage + 1) if 0 <= s < len(pipe)]
        group = [p[stage] for p in pipelines if stage < len(p)]
        at = group.index(peer)
        if len(group) > 1:
            near += [group[(at + 1) % len(group)], group[(at - 1) % len(group)]]
        return tuple(dict.fromkeys(p for p in near if p != peer))[:MAX_PARTNERS]
    return ()


def plan_links(pipelines: Sequence[Sequence[str]]) -> set[tuple[str, str]]:
    """The unordered pairs these pipelines move training traffic over (sorted pairs)."""
    pairs: set[tuple[str, str]] = set()
    for peer in {p for pipe in pipelines for p in pipe}:
        for other in partners_in(pipelines, peer):
            pairs.add((min(peer, other), max(peer, other)))
    for pipe in pipelines:
        pairs.update((min(a, b), max(a, b)) for a, b in itertools.pairwise(pipe) if a != b)
    return pairs


@dataclass
class EstimateBook:
    """A node's estimate state (a part of SwarmView: `view.links.estimate`)."""

    coordinate: NetCoordinate = field(default_factory=coordinates.origin)
    capacity: CapacityTracker = field(default_factory=CapacityTracker)
    # what peers gossiped of themselves (control/publishing.py), as received
    coordinates: dict[str, tuple[NetCoordinate, float]] = field(default_factory=dict)
    capacities: dict[str, AccessCapacity] = field(default_factory=dict)
    # our latest filtered round trip to each peer we measured (it beats a coordinate's guess)
    measured_rtts: dict[str, float] = field(default_factory=dict)
    neighbours: tuple[str, ...] = ()
    sampled: bool = False  # a bounded neighbour set (not everyone): telemetry tells it only
    _rotation: int = 0
    _rotated_at: float = float("-inf")
    _partners: tuple[str, ...] = ()
    _rng: random.Random = field(default_factory=random.Random)
    _unpublishable_logged: bool = False

    def note(
        self,
        peer: str,
        coordinate: NetCoordinate | None,
        capacity: AccessCapacity | None,
        now: float,
    ) -> None:
        """A peer's own word about its place (its telemetry): evidence for estimates."""
        if coordinate is not None:
            self.coordinates[peer] = (coordinate, now)
        if capacity is not None:
            self.capacities[peer] = capacity

    def forget(self, peer: str) -> None:
        self.coordinates.pop(peer, None)
        self.capacities.pop(peer, None)
        self.measured_rtts.pop(peer, None)

    def observe_rtt(self, peer: str, rtt_ms: float) -> None:
        """Move our coordinate by a round trip measured to `peer` (if we know where it is)."""
        if math.isfinite(rtt_ms) and rtt_ms > 0:
            self.measured_rtts[peer] = rtt_ms
        known = self.coordinates.get(peer)
        if known is not None:
            self.coordinate = coordinates.update(self.coordinate, known[0], rtt_ms, self._rng)

    def published_coordinate(self) -> NetCoordinate | None:
        """Our coordinate as receivers read it (their decoder, on the JSON we send), or None if
        it does not decode (logged once): a bad one in our telemetry would get every message of
        ours refused as malformed and us blocked swarm-wide, for our coordinate's sake alone.
        coordinates.update keeps it in bounds; this is the backstop."""
        try:
            sent = json.dumps(self.coordinate.to_dict(), allow_nan=False)
            return NetCoordinate.from_dict(json.loads(sent))
        except (ValueError, TypeError) as exc:  # WireError is a ValueError too
            if not self._unpublishable_logged:
                self._unpublishable_logged = True
                log.error(
                    "BUG: our coordinate %r does not decode (%s); not sending it",
                    self.coordinate,
                    exc,
                )
            return None

    def observe_rate(self, mbps: float, now: float, sending: bool = True) -> None:
        self.capacity.observe(mbps, now, sending)

    def coordinates_of(self, self_id: str, now: float) -> dict[str, NetCoordinate]:
        """Every recent coordinate, ours included."""
        known = {
            peer: coord
            for peer, (coord, at) in self.coordinates.items()
            if now - at <= MAX_COORDINATE_AGE_S
        }
        known[self_id] = self.coordinate
        return known

    def capacities_of(self, self_id: str, now: float) -> dict[str, AccessCapacity]:
        return {**self.capacities, self_id: self.capacity.capacity(now)}

    def choose(
        self, self_id: str, members: Iterable[str], partners: Iterable[str], now: float
    ) -> tuple[str, ...]:
        """The peers to measure now (kept in `neighbours`): every member in a small swarm; in a
        big one the bounded set (control/estimate/neighbours.py), chosen again when its random
        part rotates, when the plan's partners change or when a neighbour left."""
        others = sorted({m for m in members if m != self_id})
        self.sampled = not is_full_mesh(len(others) + 1)
        if not self.sampled:
            self.neighbours = tuple(others)
            return self.neighbours
        live, wanted = set(others), tuple(sorted(set(partners)))
        stale = (
            now - self._rotated_at >= ROTATE_RANDOM_S
            or wanted != self._partners
            or not set(self.neighbours) <= live
            or not self.neighbours
        )
        if stale:
            if now - self._rotated_at >= ROTATE_RANDOM_S:
                self._rotation += 1
                self._rotated_at = now
            self._partners = wanted
            self.neighbours = choose_neighbours(
                self_id, others, self.predicted_rtts(now), wanted, seed=self._rotation
            )
        return self.neighbours

    def predicted_rtts(self, now: float) -> Mapping[str, float]:
        """Our round trip to every peer we measured or whose coordinate we know: the measured
        one where there is one. Early on the coordinates are far from settled, and the nearest
        by them are seldom near; the nearest measured stay in the set, so a node keeps the few
        of its own city it met, whose links pin the planner's fit there (`bench control`:
        round trips within a city 4.4 -> 0.94 at the 90th percentile, all pairs 0.37 -> 0.23)."""
        predicted = {
            peer: self.coordinate.distance_ms(coord)
            for peer, (coord, at) in self.coordinates.items()
            if now - at <= MAX_COORDINATE_AGE_S
        }
        return {**predicted, **self.measured_rtts}
