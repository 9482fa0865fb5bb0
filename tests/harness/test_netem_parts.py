"""Pieces of the netem bench that need no root: the probe's rate, the sampled links, and the
commands' root check."""

from __future__ import annotations

import os

import pytest

from p2ptrain.app import main
from p2ptrain.harness.link_probe import _median_rate
from p2ptrain.harness.netem_bench import sample_pairs
from p2ptrain.testbed.links import links_from_topology


def test_median_rate_ignores_a_loss_hole_and_its_burst() -> None:
    # 1 MB/s with a 0.3 s hole whose bytes all arrive at once when it ends.
    points = [(t / 100, int(t / 100 * 1e6)) for t in range(0, 401)]
    points = [(t, b if not 1.0 <= t < 1.3 else int(1e6)) for t, b in points]
    assert _median_rate(points) == pytest.approx(1e6, rel=0.01)


def test_sample_pairs_spans_the_rtt_range() -> None:
    delays = [[0, 1, 2, 3], [1, 0, 4, 5], [2, 4, 0, 6], [3, 5, 6, 0]]
    links = links_from_topology(delays, [[1.0] * 4] * 4)
    # RTTs 2, 4, 6, 8, 10, 12: the smallest, one from the middle, the largest.
    assert sample_pairs(links, 3) == [(0, 1), (0, 3), (2, 3)]
    assert len(sample_pairs(links, 10)) == 6


def test_cli_needs_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["testbed", "list"]) == 2
    assert main(["bench", "netem", "--links", "1"]) == 2
    assert "needs root" in capsys.readouterr().err
