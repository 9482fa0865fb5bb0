"""Has the network drifted since the last plan? Its measured links against today's, plain Python.

Compared on the links some end measured at both times, not on the matrices the plan was made on:
an estimate moves only when measurements do, and the check runs in the control process every
DRIFT_CHECK_INTERVAL_S or so, where numpy never loads (numbers.py). A drift only opens a search;
the new placement replaces the current one only if it pays (placement.SWITCH_GAIN).
When the planner looks, and against which links, is DriftWatch's (plan_maker.py holds one).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from p2ptrain.control.estimate.book import is_full_mesh, plan_links
from p2ptrain.control.links import Link, link_between
from p2ptrain.records import Plan

DRIFT_FACTOR = 2.0  # a link whose round trip or rate changed by this factor counts as drift
DRIFT_FRACTION = 0.25  # ... and this fraction of the links measured both times re-plans
DRIFT_CHECK_INTERVAL_S = 10.0
MAX_DRIFT_CHECK_INTERVAL_S = 160.0
DRIFT_DWELL_S = 60.0
# ... past FULL_MESH_PEERS: each plan there is already confirmed on its own links ~30 s after
# it, a switch restarts more sessions, and 32 peers on one machine, their rates swinging 4x
# between probes, still drift-switched 60 s after each plan (twice in one measured minute)
SAMPLED_DRIFT_DWELL_S = 180.0


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


class DriftWatch:
    """The planner's watch for drift: the links its last plan was made on (the baseline), when
    it was published (no drift re-plan within the dwell after it), and the pace of the checks
    (slower after each drift not worth switching for, back to DRIFT_CHECK_INTERVAL_S at a plan).
    """

    def __init__(self) -> None:
        self._planned_links: dict[tuple[str, str], Link] | None = None  # drift's baseline
        self._planned_at = float("-inf")  # when we published our latest plan
        self._last_drift_check = 0.0
        self.check_interval_s = DRIFT_CHECK_INTERVAL_S

    def planned(self, links: dict[tuple[str, str], Link], now: float) -> None:
        """We published a plan made on `links` at `now`: the new baseline, the usual pace."""
        self._planned_links = links
        self._planned_at = now
        self.check_interval_s = DRIFT_CHECK_INTERVAL_S

    def rebase(self, links: dict[tuple[str, str], Link]) -> None:
        """A search found nothing worth switching to: `links` are the new baseline for drift."""
        self._planned_links = links

    def back_off(self) -> None:
        """A drift whose search found nothing worth switching to: noise, likely; look again in
        twice the time (reset by our next plan)."""
        self.check_interval_s = min(2 * self.check_interval_s, MAX_DRIFT_CHECK_INTERVAL_S)

    def drifted(
        self,
        now: float,
        links: dict[tuple[str, str], Link],
        members: list[str] | None,
        plan: Plan | None,
    ) -> bool:
        """Compare with the links of the last plan (links_drifted) among its `members`, at most
        every drift check interval (DRIFT_CHECK_INTERVAL_S, longer after fruitless drifts) and
        not within DRIFT_DWELL_S of it (SAMPLED_DRIFT_DWELL_S in a swarm past the full mesh)."""
        if self._planned_links is None or members is None:
            return False
        if now - self._last_drift_check < self.check_interval_s:
            return False
        sampled = not is_full_mesh(len(members))
        if now - self._planned_at < (SAMPLED_DRIFT_DWELL_S if sampled else DRIFT_DWELL_S):
            return False
        self._last_drift_check = now
        # past the full mesh, the plan's links only: both ends measure them, so no member's
        # steady word about its other links dilutes their drift (links_drifted)
        pairs = plan_links(plan.pipelines) if sampled and plan is not None else None
        return links_drifted(self._planned_links, links, members, pairs or None)
