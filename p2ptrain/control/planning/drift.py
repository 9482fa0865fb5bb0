"""Has the network drifted since the last plan? Its measured links against today's, plain Python.

Compared on the links some end measured at both times, not on the matrices the plan was made on:
an estimate moves only when measurements do, and the check runs in the control process every
DRIFT_CHECK_INTERVAL_S or so, where numpy never loads (numbers.py). A drift only opens a search;
the new placement replaces the current one only if it pays (placement.SWITCH_GAIN).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from p2ptrain.control.links import Link, link_between

DRIFT_FACTOR = 2.0  # a link whose round trip or rate changed by this factor counts as drift
DRIFT_FRACTION = 0.25  # ... and this fraction of the links measured both times re-plans


def links_drifted(
    before: Mapping[tuple[str, str], Link],
    now: Mapping[tuple[str, str], Link],
    among: Collection[str] | None = None,
    pairs: Collection[tuple[str, str]] | None = None,
) -> bool:
    """True when more than DRIFT_FRACTION of the links measured in `before` moved by
    DRIFT_FACTOR in round trip or rate (each kind counts; a probe that now fails counts as
    moved); only links between `among` (the planned members) count: a member's row may name
    up to 1,024 made-up peers, whose steady links diluted every real drift below the fraction.
    With `pairs` (sorted pairs: the plan's links, which both ends measure), only those count:
    past the full mesh most links are one end's word, and members each naming steady links
    to real members hid a drift of every honest one (20% of them, 450 links each)."""
    members = None if among is None else set(among)
    wanted = None if pairs is None else set(pairs)
    compared = moved = 0
    for (a, b), link in now.items():
        if members is not None and (a not in members or b not in members):
            continue
        if wanted is not None and (min(a, b), max(a, b)) not in wanted:
            continue
        old = link_between(before, a, b)
        if old is None:
            continue
        compared += 1
        moved += _moved(old.rtt_ms, link.rtt_ms, link.rtt_failed)
        moved += _moved(old.bandwidth_mbps or None, link.bandwidth_mbps or None, link.rate_failed)
    return compared > 0 and moved > DRIFT_FRACTION * compared


def _moved(old: float | None, new: float | None, failed: bool) -> bool:
    if old is None:
        return False  # nothing to compare with
    if new is None:
        return failed
    ratio = max(old, 1e-3) / max(new, 1e-3)
    return abs(math.log(ratio)) > math.log(DRIFT_FACTOR)
