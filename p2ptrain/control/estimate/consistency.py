"""Whose own word about its round trips contradicts what the others measured.

Past FULL_MESH_PEERS most pairs are probed by one end, and that end's word alone is the pair's
round trip (control/links.py: the pessimistic of two ends' only where both spoke). A member
claiming 0.05 ms (or 1e-160) to every peer it names was believed for each of those pairs, and
the planner's fit, bending the whole embedding to them, folded two cities 80 ms apart into one:
every honest pair nobody measured was then estimated at ~0 ms (control/estimate/fit.py).

Round trips keep the triangle inequality up to routing detours, and a factor GROSS_FACTOR off
is no detour. So each reporter's legs (the pairs whose round trip is its word alone) are
checked, two at a time, against the pair between their far ends wherever someone measured it: a
reporter that contradicts more than CONTRADICTED_SHARE of at least MIN_CHECKS such triangles is
doubted, and its lone word counts for nothing (doubted_links): those pairs are estimated like
any other pair nobody measured. An honest reporter is contradicted only where a pair's own
measurement is the lie, never by most of its triangles.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Collection, Mapping

from p2ptrain.control.links import Link, link_between

GROSS_FACTOR = 4.0
SLACK_MS = 2.0  # below this, round trips differ by a host's or a LAN's noise
MIN_CHECKS = 3
CONTRADICTED_SHARE = 0.5
MAX_LEGS = 128  # a reporter's legs checked (a row may name 1,024 peers): drawn, not chosen


def doubted_reporters(
    links: Mapping[tuple[str, str], Link], among: Collection[str]
) -> frozenset[str]:
    """The reporters whose lone round trips contradict most triangles the others measured,
    legs between `among` (the members) only: a thousand made-up far ends left a liar's draw
    with too few triangles to judge."""
    members = set(among)
    legs: dict[str, dict[str, float]] = {}
    for (a, b), link in links.items():
        if a not in members or b not in members:
            continue
        if link.rtt_ms is not None and len(link.rtt_by) == 1:
            reporter = link.rtt_by[0]
            legs.setdefault(reporter, {})[b if reporter == a else a] = link.rtt_ms
    doubted = set()
    for reporter, own in legs.items():
        ends = sorted(own)
        if len(ends) > MAX_LEGS:  # a draw the reporter cannot steer: seeded by its id
            ends = sorted(random.Random(reporter).sample(ends, MAX_LEGS))
        checks = contradicted = 0
        for i, x in enumerate(ends):
            for y in ends[i + 1 :]:
                between = link_between(links, x, y)
                if between is None or between.rtt_ms is None:
                    continue
                checks += 1
                contradicted += _contradicts(own[x], own[y], between.rtt_ms)
        if checks >= MIN_CHECKS and contradicted > CONTRADICTED_SHARE * checks:
            doubted.add(reporter)
    return frozenset(doubted)


def _contradicts(leg_x: float, leg_y: float, between: float) -> bool:
    """Do two legs from one point contradict the round trip between their far ends?"""
    too_far = between > GROSS_FACTOR * (leg_x + leg_y) + SLACK_MS
    too_near = abs(leg_x - leg_y) > GROSS_FACTOR * between + SLACK_MS
    return too_far or too_near


def doubted_links(
    links: Mapping[tuple[str, str], Link], doubted: frozenset[str]
) -> dict[tuple[str, str], Link]:
    """`links` less the doubted reporters' lone words (round trips and rates): those pairs are
    then not measured, and estimated."""
    screened = {}
    for pair, link in links.items():
        lone_rtt = len(link.rtt_by) == 1 and link.rtt_by[0] in doubted
        lone_rate = len(link.rate_by) == 1 and link.rate_by[0] in doubted
        if lone_rtt:
            link = dataclasses.replace(link, rtt_ms=None, rtt_by=(), rtt_low_ms=None)
        if lone_rate:
            link = dataclasses.replace(
                link, bandwidth_mbps=None, rate_by=(), rate_from="", rate_high_mbps=None
            )
        screened[pair] = link
    return screened
