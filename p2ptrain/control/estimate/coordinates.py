"""Vivaldi network coordinates with a height (Dabek et al., SIGCOMM 2004; the constants follow
hashicorp/serf's tuned implementation).

Each node keeps a coordinate and moves it a little after every round trip it measures, as if
the two points were joined by a spring whose rest length is the round trip. The height models
the access link, which every round trip crosses twice and no Euclidean embedding represents
well. A node weighs a sample by how sure it is against how sure the other is, so settled nodes
move little and newcomers fast. A few samples per node, some of them far away, place everyone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from p2ptrain.records.estimate import (
    COORDINATE_DIMENSIONS,
    MAX_COORDINATE_ERROR,
    MAX_COORDINATE_MS,
    NetCoordinate,
)

ERROR_GAIN = 0.25  # ce: how fast the error estimate follows the latest samples
MOVE_GAIN = 0.25  # cc: how far one sample moves the coordinate
MIN_HEIGHT_MS = 0.01
# the far end's error is its own word: one claiming 0 would take full weight and move us as far
# as it likes, so it is read as at least this (a well-settled node's own estimate)
MIN_REMOTE_ERROR = 0.1
# a longer round trip is no distance but a stalled or stalling peer (serf's maxRTT); our probes
# give up on an echo after 3 s
MAX_RTT_MS = 10_000.0
# a settled coordinate: its own error estimate at most this (the planner's first plan waits for
# most members to get there: control/estimate/matrix.py settled())
SETTLED_ERROR = 0.35
# round trips under this are judged against it, not against themselves: a planner cannot tell
# them apart (a hop's time is in its transfers), and the relative error of a LAN's or a loopback
# swarm's sub-millisecond scheduling jitter kept every coordinate unsettled (32 peers on one
# machine: 0 of 32 settled after minutes). The shipped city data's round trips are all above it.
NEAR_RTT_MS = 5.0


def update(
    own: NetCoordinate,
    remote: NetCoordinate,
    rtt_ms: float,
    rng: random.Random | None = None,
) -> NetCoordinate:
    """`own` moved by one round trip `rtt_ms` measured to the node at `remote`, kept within the
    record's bounds (a coordinate out of them would make our own telemetry malformed)."""
    if not (math.isfinite(rtt_ms) and 0 < rtt_ms <= MAX_RTT_MS):
        return own
    predicted = own.distance_ms(remote)
    weight = own.error / (own.error + max(remote.error, MIN_REMOTE_ERROR))
    sample_error = abs(predicted - rtt_ms) / max(rtt_ms, NEAR_RTT_MS)
    error = sample_error * ERROR_GAIN * weight + own.error * (1 - ERROR_GAIN * weight)
    gap = rtt_ms - predicted  # > 0: too close, push apart
    force = MOVE_GAIN * weight * gap
    direction, length = _unit_away(own, remote, rng or random.Random(0))
    vector = tuple(
        _clamp(x + force * d, -MAX_COORDINATE_MS, MAX_COORDINATE_MS)
        for x, d in zip(own.vector, direction, strict=True)
    )
    height = own.height_ms
    if length > 1e-9:  # the height takes its share of the push (serf's ApplyForce)
        # serf divides by the vectors' distance alone: a peer claiming a point next to ours
        # and a tall height multiplied one sample's push ~1e5-fold. No step past the whole gap
        share = force * (own.height_ms + remote.height_ms) / length
        height += _clamp(share, -abs(gap), abs(gap))
    height = _clamp(height, MIN_HEIGHT_MS, MAX_COORDINATE_MS)
    return NetCoordinate(vector, height, _clamp(error, 0.0, MAX_COORDINATE_ERROR))


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def _unit_away(
    own: NetCoordinate, remote: NetCoordinate, rng: random.Random
) -> tuple[tuple[float, ...], float]:
    """The unit vector from `remote` towards `own` and their Euclidean distance (two coincident
    points part in a random direction)."""
    diff = [a - b for a, b in zip(own.vector, remote.vector, strict=True)]
    length = math.hypot(*diff)
    if length < 1e-9:
        diff = [rng.gauss(0.0, 1.0) for _ in diff]
        norm = math.hypot(*diff) or 1.0
        return tuple(d / norm for d in diff), 0.0
    return tuple(d / length for d in diff), length


def origin() -> NetCoordinate:
    return NetCoordinate((0.0,) * COORDINATE_DIMENSIONS, MIN_HEIGHT_MS, 1.0)


def settled(errors: Sequence[float], fraction: float = 0.5) -> bool:
    """Have at least `fraction` of these coordinates' own error estimates reached SETTLED_ERROR?"""
    if not errors:
        return False
    return sum(e <= SETTLED_ERROR for e in errors) >= fraction * len(errors)
