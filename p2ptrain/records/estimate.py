"""What a peer tells the swarm about its own place in the network, so that links nobody measured
can be estimated: its network coordinate (Vivaldi with a height: control/estimate/coordinates.py)
and its access capacity (the fastest it was seen to send and receive: control/estimate/capacity.py).
Both are a peer's word about itself: evidence for estimates, refined by direct measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from p2ptrain.records import fields as f
from p2ptrain.records.codec import Custom, Nullable, Num, Record, Wire

COORDINATE_DIMENSIONS = 3  # Euclidean part; the height is kept apart
MAX_COORDINATE_MS = 1e5  # beyond any round trip on Earth, far below float trouble
MAX_COORDINATE_ERROR = 1.5  # Vivaldi's own cap on the relative error estimate
MAX_CAPACITY_MBPS = 1e7


def _vector(value: object, record: str, name: str) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != COORDINATE_DIMENSIONS:
        raise f.malformed(record, f"{name} must list {COORDINATE_DIMENSIONS} numbers")
    return tuple(f.number(x, record, name, -MAX_COORDINATE_MS, MAX_COORDINATE_MS) for x in value)


def _rounded(vector: tuple[float, ...]) -> list[float]:
    return [round(x, 2) for x in vector]


@dataclass(frozen=True)
class NetCoordinate(Record, name="coordinate"):
    """A point whose distance to another predicts the round trip in ms: |a - b| + a.height +
    b.height (the height is the access link's share of every round trip). `error` is the
    peer's own running estimate of its relative prediction error (1.0: knows nothing yet).
    Short keys, rounded values: every telemetry message carries one."""

    vector: Annotated[
        tuple[float, ...], Custom(_vector, _rounded), Wire(key="v", required=True)
    ] = (0.0,) * COORDINATE_DIMENSIONS
    height_ms: Annotated[
        float, Num(0.0, MAX_COORDINATE_MS, digits=2), Wire(key="h", required=True)
    ] = 0.0
    error: Annotated[
        float, Num(0.0, MAX_COORDINATE_ERROR, digits=3), Wire(key="e", required=True)
    ] = 1.0

    def distance_ms(self, other: NetCoordinate) -> float:
        """The round trip this coordinate predicts to `other`."""
        return math.dist(self.vector, other.vector) + self.height_ms + other.height_ms


Capacity = Annotated[float | None, Nullable(Num(0.0, MAX_CAPACITY_MBPS, digits=2))]


@dataclass(frozen=True)
class AccessCapacity(Record, name="capacity"):
    """The fastest this peer was seen to send (`up_mbps`) and receive (`down_mbps`), from its
    probes and its transfer counters; None: never seen yet."""

    up_mbps: Capacity = None
    down_mbps: Capacity = None
