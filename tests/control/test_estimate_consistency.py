"""Whose lone word about round trips is doubted (control/estimate/consistency.py): a member
claiming 0.05 ms to every peer it names folded two cities 80 ms apart into one in the planner's
estimate; its claims contradict the triangles the others measured, honest ones do not."""

from __future__ import annotations

import random

import numpy as np
import pytest

from p2ptrain.control.estimate.consistency import doubted_links, doubted_reporters
from p2ptrain.control.estimate.matrix import live_matrices
from p2ptrain.control.links import Link, freshest_links
from p2ptrain.records import LinkReport
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate
from tests.control.test_estimate_fit import _cities

HONEST = [f"h{i:02d}" for i in range(40)]


def _two_cities() -> tuple[
    dict[str, tuple[float, float, float]], dict[str, tuple[dict[str, LinkReport], float]]
]:
    """40 peers in two cities 80 ms apart, each probing 8 others, truthfully."""
    rng = random.Random(1)
    pos = {
        p: ((0.0 if i < 20 else 80.0) + rng.uniform(-3, 3), rng.uniform(-3, 3), 0.0)
        for i, p in enumerate(HONEST)
    }
    rows = {}
    for p in HONEST:
        partners = rng.sample([q for q in HONEST if q != p], 8)
        rows[p] = ({q: LinkReport(_rtt(pos, p, q), 1.0, 100.0, 1.0) for q in partners}, 0.0)
    return pos, rows


def _rtt(pos: dict[str, tuple[float, float, float]], a: str, b: str) -> float:
    return float(np.linalg.norm(np.subtract(pos[a], pos[b]))) + 2.0


@pytest.mark.parametrize("claim_ms", [0.05, 1e-160, 0.0])
def test_a_member_claiming_to_be_next_to_everyone_is_doubted(claim_ms: float) -> None:
    pos, rows = _two_cities()
    rows["liar"] = ({q: LinkReport(claim_ms, 1.0, None, None) for q in HONEST}, 0.0)
    links = freshest_links(rows, now=0.5)
    assert doubted_reporters(links, [*HONEST, "liar"]) == {"liar"}
    peers = [*HONEST, "liar"]
    coords = {p: NetCoordinate(pos[p], 1.0, 0.2) for p in HONEST}
    coords["liar"] = NetCoordinate((40.0, 0.0, 0.0), 1.0, 0.2)
    caps = {p: AccessCapacity(100.0, 100.0) for p in peers}
    m = live_matrices(peers, links, coords, caps)
    errors = [
        abs(2 * m.matrices.delay_ms[i, j] - _rtt(pos, a, b)) / _rtt(pos, a, b)
        for i, a in enumerate(HONEST)
        for j, b in enumerate(HONEST)
        if i < j and not m.rtt_measured[i, j]
    ]
    assert float(np.quantile(errors, 0.9)) < 0.3  # the folded fit: ~1.0 everywhere
    assert not m.rtt_measured[-1, :-1].any()  # its pairs are estimated, not its word
    assert 2 * float(m.matrices.delay_ms[-1, 0]) > 10.0  # it is no longer next to everyone


def test_honest_reporters_are_not_doubted() -> None:
    peers, rtt, _ = _cities(120, 1)
    rng = np.random.default_rng(4)
    rows = {}
    for i, p in enumerate(peers):  # each probes 8 others and reports with a little noise
        partners = rng.choice(len(peers), 8, replace=False)
        rows[p] = (
            {
                peers[j]: LinkReport(float(rtt[i, j] * rng.uniform(0.9, 1.3)), 1.0, None, None)
                for j in partners
                if j != i
            },
            0.0,
        )
    assert doubted_reporters(freshest_links(rows, now=0.5), peers) == frozenset()


def test_only_a_doubted_reporters_lone_words_go() -> None:
    links = {
        ("a", "liar"): Link(0.05, 5.0, 1.0, rate_by=("liar",), rtt_by=("liar",)),
        ("b", "liar"): Link(30.0, 5.0, 1.0, rate_by=("b", "liar"), rtt_by=("b", "liar")),
        ("a", "b"): Link(30.0, 50.0, 1.0, rate_by=("a",), rtt_by=("a",)),
    }
    screened = doubted_links(links, frozenset({"liar"}))
    assert screened[("a", "liar")].rtt_ms is None and screened[("a", "liar")].bandwidth_mbps is None
    assert screened[("b", "liar")] == links[("b", "liar")]  # b's word too: the pessimistic stands
    assert screened[("a", "b")] == links[("a", "b")]


def test_made_up_far_ends_do_not_hide_a_liar() -> None:
    """Its legs were drawn from every peer it named: with 1,000 made-up ones beside 40 real,
    too few triangles were left to judge it."""
    _, rows = _two_cities()
    claims = {q: LinkReport(0.05, 1.0, None, None) for q in HONEST}
    claims.update({f"fake{n:04d}": LinkReport(0.05, 1.0, None, None) for n in range(1000)})
    rows["liar"] = (claims, 0.0)
    assert doubted_reporters(freshest_links(rows, now=0.5), [*HONEST, "liar"]) == {"liar"}
