"""What a peer tells the swarm about its own place in the network, so that links nobody measured
can be estimated: its network coordinate (Vivaldi with a height: control/estimate/coordinates.py)
and its access capacity (the fastest it was seen to send and receive: control/estimate/capacity.py).
Both are a peer's word about itself: evidence for estimates, refined by direct measurements."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from p2ptrain.records import fields as f

COORDINATE_DIMENSIONS = 3  # Euclidean part; the height is kept apart
MAX_COORDINATE_MS = 1e5  # beyond any round trip on Earth, far below float trouble
MAX_COORDINATE_ERROR = 1.5  # Vivaldi's own cap on the relative error estimate
MAX_CAPACITY_MBPS = 1e7


@dataclass(frozen=True)
class NetCoordinate:
    """A point whose distance to another predicts the round trip in ms: |a - b| + a.height +
    b.height (the height is the access link's share of every round trip). `error` is the
    peer's own running estimate of its relative prediction error (1.0: knows nothing yet)."""

    vector: tuple[float, ...] = (0.0,) * COORDINATE_DIMENSIONS
    height_ms: float = 0.0
    error: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": [round(x, 2) for x in self.vector],
            "h": round(self.height_ms, 2),
            "e": round(self.error, 3),
        }

    @classmethod
    def from_dict(cls, data: object) -> NetCoordinate:
        d = f.mapping(data, "coordinate")
        f.require_keys(d, "coordinate", ("v", "h", "e"))
        vector = d["v"]
        if not isinstance(vector, list) or len(vector) != COORDINATE_DIMENSIONS:
            raise f.malformed("coordinate", f"v must list {COORDINATE_DIMENSIONS} numbers")
        return cls(
            vector=tuple(
                f.number(x, "coordinate", "v", -MAX_COORDINATE_MS, MAX_COORDINATE_MS)
                for x in vector
            ),
            height_ms=f.number(d["h"], "coordinate", "h", 0.0, MAX_COORDINATE_MS),
            error=f.number(d["e"], "coordinate", "e", 0.0, MAX_COORDINATE_ERROR),
        )

    def distance_ms(self, other: NetCoordinate) -> float:
        """The round trip this coordinate predicts to `other`."""
        return math.dist(self.vector, other.vector) + self.height_ms + other.height_ms


@dataclass(frozen=True)
class AccessCapacity:
    """The fastest this peer was seen to send (`up_mbps`) and receive (`down_mbps`), from its
    probes and its transfer counters; None: never seen yet."""

    up_mbps: float | None = None
    down_mbps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: None if v is None else round(v, 2) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: object) -> AccessCapacity:
        d = f.mapping(data, "capacity")
        values = []
        for name in ("up_mbps", "down_mbps"):
            value = d.get(name)
            values.append(
                None if value is None else f.number(value, "capacity", name, 0.0, MAX_CAPACITY_MBPS)
            )
        return cls(*values)
