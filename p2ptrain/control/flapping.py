"""Damping for members that flap in and out of the plannable set (plan_inputs.plannable_members).

A member that leaves the set (dead, unhealthy, a role no plan places) is planned around at once,
and every change of the set is a new plan after PLAN_DEBOUNCE_S: a new plan restarts every
session in the swarm (checkpoint, start agreement, state transfer). A member that flipped the
health its telemetry reports every few seconds, went silent for DEAD_AFTER_S at a time, or
toggled its record's role made a new plan every few seconds. So leaving stays immediate, and a
member that comes back counts again only once it has stayed back for a back-off that doubles
with its recent leaves (`rejoin_s`):
- the first return after a quiet spell counts at once (a restart, a network blip);
- the n-th return within the member's memory waits REJOIN_S x 2^(n - 2), at most MAX_REJOIN_S;
- its count of leaves drops by one for each FLAP_DECAY_S since its last leave, so an honest
  member's past is forgotten, and a flapper at the cap makes two plans per MAX_REJOIN_S at most.
A member never in the set before (a join) counts at once, and so does one the current plan still
names (a blip within the debounce changed no plan); our own node is never damped: its
health is this node's own verdict (control/health.py), not a claim. Leaves are seen when the set
is asked for (the planner's tick, among others): a flip between two asks changed no plan either.
Pure, the clock passed in.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from p2ptrain.records import Plan

REJOIN_S = 15.0  # the back-off of a second return within FLAP_DECAY_S
MAX_DOUBLINGS = 5
MAX_REJOIN_S = REJOIN_S * 2**MAX_DOUBLINGS  # 8 min: under FLAP_DECAY_S, so a flapper stays there
FLAP_DECAY_S = 600.0
MAX_FLAPS = MAX_DOUBLINGS + 2  # the count that gives MAX_REJOIN_S: more is not remembered


@dataclass
class Flaps:
    """One member's recent leaves: how many, the last one's time, and since when it is back
    (None: out of the set now)."""

    count: int
    left_at: float
    back_at: float | None = None

    def count_at(self, now: float) -> int:
        """The count of leaves, less one for each FLAP_DECAY_S since the last."""
        return max(0, self.count - int((now - self.left_at) // FLAP_DECAY_S))


def rejoin_s(num_leaves: int) -> float:
    """How long a member back after `num_leaves` recent leaves (the last included) must stay
    back before it counts: 0 for the first."""
    if num_leaves <= 1:
        return 0.0
    return REJOIN_S * 2 ** min(num_leaves - 2, MAX_DOUBLINGS)


class Flapping:
    """The members one view has seen leave the plannable set lately, and the set it saw last."""

    def __init__(self, self_id: str) -> None:
        self.self_id = self_id
        self.flaps: dict[str, Flaps] = {}
        self._present: set[str] = set()  # the set as last seen, before the back-offs
        self._now = float("-inf")

    def admit(
        self, peers: list[str], now: float, known: Container[str], plan: Plan | None = None
    ) -> list[str]:
        """`peers` (the live, healthy members now) less those still in their back-off, in
        order. `known`: the members; what is kept of any other is forgotten. A member `plan`
        names is never held back: back within the debounce, it costs no plan at all (held
        back, a blip cost two, and a lone holder's steps since its last save)."""
        now = self._now = max(now, self._now)  # callers' clocks may be a moment apart
        present = set(peers) - {self.self_id}
        for peer in self._present - present:  # gone: at once, one more leave
            flaps = self.flaps.get(peer)
            count = 0 if flaps is None else flaps.count_at(now)
            self.flaps[peer] = Flaps(min(MAX_FLAPS, count + 1), now)
        for peer in present - self._present:  # back: its back-off starts
            if (flaps := self.flaps.get(peer)) is not None:
                flaps.back_at = now
        self._present = present
        self.flaps = {
            peer: flaps
            for peer, flaps in self.flaps.items()
            if peer in known and flaps.count_at(now) > 0
        }
        named = plan.peers() if plan is not None else set()
        return [peer for peer in peers if peer in named or self.counts(peer, now)]

    def counts(self, peer: str, now: float) -> bool:
        """Is `peer`, in the set when last seen, past its back-off at `now`?"""
        flaps = self.flaps.get(peer)
        if flaps is None or peer == self.self_id:
            return True
        if flaps.back_at is None:
            return False
        return now - flaps.back_at >= rejoin_s(flaps.count_at(now))
