"""Link specs, topology scaling and the forwarder's per-link queue arithmetic (no root needed)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from p2ptrain.errors import UserError
from p2ptrain.testbed.forwarder import MIN_QUEUE_BYTES, _Link
from p2ptrain.testbed.links import LinkSpec, configured_rtt_ms, links_from_topology


def test_links_from_topology_scales_rates_and_delays() -> None:
    delay = np.array([[0, 10, 40], [10, 0, 25], [40, 25, 0]], dtype=float)
    bandwidth = np.array([[0, 2, 0.5], [2, 0, 1], [0.5, 1, 0]], dtype=float)
    links = links_from_topology(delay, bandwidth, bandwidth_scale=0.01, delay_scale=2)
    assert set(links) == {(a, b) for a in range(3) for b in range(3) if a != b}
    assert links[(0, 1)] == LinkSpec(delay_ms=20.0, rate_mbps=20.0)
    assert links[(2, 0)] == LinkSpec(delay_ms=80.0, rate_mbps=5.0)
    assert configured_rtt_ms(links, 1, 2) == 100.0


@pytest.mark.parametrize(
    "fields",
    [
        {"delay_ms": -1, "rate_mbps": 1},
        {"delay_ms": 1, "rate_mbps": 0},
        {"delay_ms": 1, "rate_mbps": float("nan")},
        {"delay_ms": 1, "rate_mbps": 1, "loss": 1.5},
        {"delay_ms": 1, "rate_mbps": 1, "jitter_ms": -2},
    ],
)
def test_bad_link_values_are_user_errors(fields: dict[str, float]) -> None:
    with pytest.raises(UserError):
        LinkSpec(**fields)


def test_link_paces_packets_at_its_rate_then_adds_the_delay() -> None:
    link = _Link(LinkSpec(delay_ms=50, rate_mbps=8), reverse_delay_ms=50)  # 1 byte per us
    due = [link.admit(0.0, 1000) for _ in range(3)]
    assert due == pytest.approx([0.051, 0.052, 0.053])
    # A packet arriving after the queue drained waits for nothing but the delay.
    assert link.admit(1.0, 1000) == pytest.approx(1.051)


def test_link_drops_beyond_its_queue_and_when_cut() -> None:
    link = _Link(LinkSpec(delay_ms=0, rate_mbps=8), reverse_delay_ms=0)
    queue_s = link.queue_limit_s
    assert queue_s == pytest.approx(MIN_QUEUE_BYTES * 1e-6)
    admitted = sum(link.admit(0.0, 1000) is not None for _ in range(200))
    assert admitted == pytest.approx(queue_s / 1e-3, abs=2)
    assert link.dropped == 200 - admitted
    link.configure(LinkSpec(delay_ms=0, rate_mbps=8, up=False), 0)
    assert link.admit(10.0, 100) is None


def test_link_loss_rate_and_jitter_keep_order() -> None:
    random.seed(7)
    link = _Link(LinkSpec(delay_ms=20, rate_mbps=1000, jitter_ms=10, loss=0.2), 20)
    due = [link.admit(i * 1e-3, 100) for i in range(5000)]
    delivered = [d for d in due if d is not None]
    assert 0.17 < 1 - len(delivered) / len(due) < 0.23
    assert delivered == sorted(delivered)
    assert min(d - i * 1e-3 for i, d in enumerate(due) if d is not None) >= 0.0
