"""What harness/control_sim.py's simulation keeps of each peer (its coordinate, capacity,
links, neighbour set; a candidate's real SwarmView) and the control traffic it charges to each."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from p2ptrain.control.estimate import coordinates
from p2ptrain.control.estimate.capacity import CapacityTracker
from p2ptrain.control.links import LinkSample
from p2ptrain.control.view import SwarmView
from p2ptrain.records.estimate import NetCoordinate


@dataclass
class SimPeer:
    index: int
    peer_id: str
    joined_at: float
    rng: random.Random
    alive: bool = True
    coord: NetCoordinate = field(default_factory=coordinates.origin)
    capacity: CapacityTracker = field(default_factory=CapacityTracker)
    links: dict[int, LinkSample] = field(default_factory=dict)
    neighbours: tuple[int, ...] = ()
    seen: dict[int, NetCoordinate] = field(default_factory=dict)
    partners: tuple[int, ...] = ()
    next_probe: int = 0
    rotation: int = 0
    seq: int = 0
    view: SwarmView | None = None  # candidates only
    seed: bytes = b""


@dataclass
class Counters:
    control_bytes: dict[int, float] = field(default_factory=dict)
    messages: dict[int, float] = field(default_factory=dict)
    probe_bytes: dict[int, float] = field(default_factory=dict)
    bytes_by_kind: dict[str, dict[int, float]] = field(default_factory=dict)

    def charge(
        self, peer: int, num_bytes: float, num_messages: float = 1.0, kind: str = ""
    ) -> None:
        self.control_bytes[peer] = self.control_bytes.get(peer, 0.0) + num_bytes
        self.messages[peer] = self.messages.get(peer, 0.0) + num_messages
        by_peer = self.bytes_by_kind.setdefault(kind, {})
        by_peer[peer] = by_peer.get(peer, 0.0) + num_bytes
