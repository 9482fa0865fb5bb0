"""Security 29.8: a peer's coordinate is its own word (its RTT probe's answer or its telemetry).
Whatever it claims and however it delays its echoes, our coordinate stays within the record's
bounds, and our telemetry stays decodable: receivers penalise the author of a malformed one."""

from __future__ import annotations

import json
import logging
import math
import random
from typing import Any, cast

import pytest
import trio

from p2ptrain.control import wire
from p2ptrain.control.authored import telemetry_message
from p2ptrain.control.estimate import coordinates
from p2ptrain.control.measuring import LinkProber, far_coordinate
from p2ptrain.control.state import NodeState
from p2ptrain.records import Telemetry
from p2ptrain.records.estimate import MAX_COORDINATE_ERROR, MAX_COORDINATE_MS, NetCoordinate
from tests.control.test_gossip_screen import make_node

LIAR = "12D3KooWLiarLiarLiarLiarLiarLiarLiarLiarLiarLiar"


def _in_bounds(coord: NetCoordinate) -> bool:
    values = (*coord.vector, coord.height_ms, coord.error)
    return (
        all(math.isfinite(v) for v in values)
        and all(abs(x) <= MAX_COORDINATE_MS for x in coord.vector)
        and 0.0 <= coord.height_ms <= MAX_COORDINATE_MS
        and 0.0 <= coord.error <= MAX_COORDINATE_ERROR
    )


def _probe_answered(state: NodeState, claim: NetCoordinate, rtt_ms: float) -> None:
    """What LinkProber._probe_rtt does with one answered probe of the liar."""
    links, now = state.view.links, 0.0
    links.estimate.note(LIAR, far_coordinate(json.dumps(claim.to_dict()).encode()), None, now)
    links.record_rtt(LIAR, rtt_ms, now)


def _sent_coordinate(state: NodeState) -> NetCoordinate | None:
    """Our telemetry as a receiver decodes it (raises WireError where it would penalise us)."""
    body = wire.decode(telemetry_message(state)).body
    assert isinstance(body, Telemetry)
    return body.coordinate


def test_a_prompt_liar_at_the_far_corner_cannot_push_us_out_of_bounds() -> None:
    """Variant A: it answers promptly and claims the record's far corner with error 0 (full
    weight); before, our coordinate overshot past 1e5 after 4 probes."""
    state, _ = make_node()
    corner = NetCoordinate((MAX_COORDINATE_MS,) * 3, MAX_COORDINATE_MS, 0.0)
    for _ in range(20):
        _probe_answered(state, corner, 20.0)
        assert _in_bounds(state.view.links.estimate.coordinate)
        assert _sent_coordinate(state) == state.view.links.estimate.published_coordinate()
    assert _sent_coordinate(state) is not None


def test_a_liar_next_to_us_with_a_tall_height_and_slow_echoes_cannot_blow_up_our_height() -> None:
    """Variant B: a vector 0.01 ms from ours, height 1000 ms, echoes delayed to 2.5 s. Before,
    one probe set our height to 3.7e7 ms and our telemetry was refused as malformed."""
    state, _ = make_node()
    own = NetCoordinate((10.0, 0.0, 0.0), 5.0, 0.2)
    state.view.links.estimate.coordinate = own
    _probe_answered(state, NetCoordinate((10.01, 0.0, 0.0), 1000.0, 0.0), 2500.0)
    moved = state.view.links.estimate.coordinate
    assert _in_bounds(moved)
    # no further than the whole gap between the round trip and what we predicted
    assert moved.height_ms <= own.height_ms + 2500.0
    assert _sent_coordinate(state) is not None


def test_a_claimed_error_of_zero_weighs_as_a_settled_peer_not_as_certainty() -> None:
    own = NetCoordinate((0.0, 0.0, 0.0), 1.0, 0.1)
    far = NetCoordinate((100.0, 0.0, 0.0), 1.0, 0.0)
    moved = coordinates.update(own, far, 10.0)
    weight = own.error / (own.error + coordinates.MIN_REMOTE_ERROR)  # not 1.0
    pull = coordinates.MOVE_GAIN * weight * (own.distance_ms(far) - 10.0)  # too far: nearer
    assert moved.vector[0] == pytest.approx(pull)


def test_update_is_finite_and_in_bounds_whatever_the_far_end_claims() -> None:
    """Fuzz: any coordinate a receiver can decode, any round trip: the result is one too."""
    rng = random.Random(298)
    edge = (0.0, 1e-9, 0.01, 1.0, 1e3, MAX_COORDINATE_MS)

    def claim() -> NetCoordinate:
        def pick() -> float:
            return rng.choice(edge) * rng.choice((-1.0, 1.0)) if rng.random() < 0.5 else 0.0

        vector = tuple(rng.choice((pick(), rng.uniform(-1, 1) * MAX_COORDINATE_MS)) for _ in "xyz")
        height = rng.choice((*edge, rng.uniform(0, MAX_COORDINATE_MS)))
        return NetCoordinate(vector, height, rng.choice((0.0, 1e-3, 1.0, MAX_COORDINATE_ERROR)))

    rtts = (float("nan"), float("inf"), -1.0, 0.0, 1e-300, 0.5, 2500.0, 1e4, 1e7, 1e300)
    for _ in range(3000):
        own = claim() if rng.random() < 0.3 else coordinates.origin()
        for _ in range(5):
            own = coordinates.update(own, claim(), rng.choice(rtts), rng)
            assert _in_bounds(own), own
            NetCoordinate.from_dict(json.loads(json.dumps(own.to_dict(), allow_nan=False)))


def test_an_out_of_range_coordinate_is_left_out_of_our_telemetry_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The backstop: should our coordinate ever leave the record's bounds, receivers would
    refuse our telemetry whole and block us; we send it without the coordinate instead."""
    state, _ = make_node()
    bad = NetCoordinate((0.0, 0.0, 0.0), 3.7e7, 0.3)
    state.view.links.estimate.coordinate = bad
    unchecked = wire.encode(state.seed, 1, Telemetry(links={}, coordinate=bad))
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode(unchecked)
    with caplog.at_level(logging.ERROR):
        assert _sent_coordinate(state) is None
        assert _sent_coordinate(state) is None
        # nor does our RTT probes' answer carry it (a bad one there costs only itself)
        assert LinkProber(cast(Any, None), state.view, trio.Event()).coordinate_trailer() == b""
    assert sum("does not decode" in r.getMessage() for r in caplog.records) == 1
