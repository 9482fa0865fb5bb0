"""Bandwidth probe sizing (control/measuring.py): a long link's probes grow until they measure
the link's rate rather than TCP's window."""

from __future__ import annotations

from p2ptrain.control.links import LinkSample
from p2ptrain.control.measuring import (
    BANDWIDTH_PROBE_BYTES,
    FIRST_BANDWIDTH_PROBE_BYTES,
    MIN_BANDWIDTH_PROBE_BYTES,
    probe_bytes,
    window_bound,
)


def test_the_first_probe_is_small_and_later_ones_stay_within_bounds() -> None:
    assert probe_bytes(None, 0.4) == FIRST_BANDWIDTH_PROBE_BYTES
    assert probe_bytes(0.01, 0.0) == MIN_BANDWIDTH_PROBE_BYTES
    assert probe_bytes(10_000.0, 0.5) == BANDWIDTH_PROBE_BYTES


def test_a_window_bound_probe_on_a_long_link_makes_the_next_one_bigger() -> None:
    # 128 KiB on a 446 ms round trip: the second half crossed in one round trip (the window)
    rtt_s = 0.446
    first = FIRST_BANDWIDTH_PROBE_BYTES
    seen_mbps = (first / 2) * 8 / rtt_s / 1e6  # ~1.2 Mbit/s, whatever the link's rate
    assert window_bound(seen_mbps, first, rtt_s)
    bigger = probe_bytes(seen_mbps, rtt_s)
    assert bigger > 3 * first  # 8 round trips at the window-bound rate: about 4x
    # a short link's probe at its rate is not window-bound and keeps the time target
    assert not window_bound(40.0, 2 * 1024 * 1024, 0.010)
    assert probe_bytes(20.0, 0.010) == int(20e6 / 8 * 0.5)


def test_an_unknown_round_trip_never_counts_as_window_bound() -> None:
    assert not window_bound(1.0, FIRST_BANDWIDTH_PROBE_BYTES, 0.0)


def test_a_window_bound_rate_is_a_floor_until_a_probe_measures_the_link() -> None:
    sample = LinkSample()
    sample.add_bandwidth(1.2, now=1.0, window_bound=True)
    sample.add_bandwidth(3.5, now=5.0, window_bound=True)
    # not a rate the planner may use (the link still counts as unmeasured), only a floor
    assert sample.bandwidth_mbps is None and sample.rate_floor_mbps == 3.5
    sample.add_bandwidth(7.1, now=9.0)
    assert sample.bandwidth_mbps == 7.1
    # once measured, a window-bound probe is one more sample: the best recent one counts
    sample.add_bandwidth(2.0, now=12.0, window_bound=True)
    assert sample.bandwidth_mbps == 7.1
