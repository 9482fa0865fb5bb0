"""What the dashboard shows over time: the run's loss and throughput per step, and the swarm's
events (joins, leaves, deaths, elections, re-plans with their reason and predicted gain).

Both are read off successive status documents (records/status.py), the same the node answers
`p2ptrain status` with: whatever this node's view learns, the page shows, and nothing else.
Bounded: the oldest points and events are dropped first.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from p2ptrain.records import PeerStatus, PlanSummary, SwarmStatus

MAX_POINTS = 5000
MAX_EVENTS = 500
LARGEST = sys.float_info.max

REASON_TEXT = {
    "first": "first plan",
    "members": "members changed",
    "drift": "links drifted",
    "compute": "compute measured",
    "addresses": "data addresses changed",
}


@dataclass(frozen=True)
class Point:
    """The run near one step: the replicas' mean loss and the swarm's tokens/s (their sum)."""

    t: float  # wall clock, seconds since the epoch
    step: int
    loss: float
    tokens_per_s: float


@dataclass(frozen=True)
class Event:
    t: float  # wall clock, seconds since the epoch
    kind: str  # "join", "leave", "death", "back", "election", "plan"
    text: str
    peer: str | None = None


def short(peer: str | None) -> str:
    return "-" if peer is None else f"…{peer[-8:]}"


def clamped(value: float) -> float:
    """value within the finite floats (a sum of peers' finite reports can overflow)."""
    return 0.0 if math.isnan(value) else max(-LARGEST, min(LARGEST, value))


def mean(values: list[float]) -> float:
    """Their mean, finite for any finite values (fsum of the values would overflow)."""
    return clamped(math.fsum(v / len(values) for v in values))


def median(values: list[float]) -> float:
    """Their median, finite for any finite values (statistics.median adds the middle two)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return ordered[middle - 1] / 2 + ordered[middle] / 2


def measured_step_s(status: SwarmStatus) -> float | None:
    """The median of the placed peers' latest step times."""
    plan = status.plan
    placed = set() if plan is None else {p for pipe in plan.pipelines for p in pipe}
    times = [
        p.metrics.step_s
        for p in status.peers
        if p.id in placed and p.metrics is not None and p.metrics.step_s is not None
    ]
    return median(times) if times else None


def plan_text(plan: PlanSummary) -> str:
    shape = f"{len(plan.pipelines)} × {plan.stages}"
    reason = REASON_TEXT.get(plan.reason, plan.reason or "reason not given")
    text = f"plan {plan.term}/{plan.epoch} by {short(plan.planner)}: {shape}, {reason}"
    if plan.previous_cost_s is not None and plan.previous_cost_s > 0:
        # bounded: a plan a million times slower reads as such, not as 300 digits
        gain = max(-1e6, 1 - plan.cost_s / plan.previous_cost_s)
        before, after = _seconds(plan.previous_cost_s, 3), _seconds(plan.cost_s, 3)
        text += f", predicted cost {before} → {after} s"
        text += f" ({gain:+.0%} faster)" if gain >= 0 else f" ({-gain:.0%} slower)"
    if plan.predicted_step_s is not None:
        text += f", step {_seconds(plan.predicted_step_s, 2)} s predicted"
    return text


def _seconds(value: float, decimals: int) -> str:
    # fixed decimals in the usual range; past it, 1e+308 rather than 309 digits
    return f"{value:.{decimals}f}" if abs(value) < 1e6 else f"{value:.3g}"


class SwarmHistory:
    """Points and events, fed one status document at a time."""

    def __init__(self, max_points: int = MAX_POINTS, max_events: int = MAX_EVENTS) -> None:
        self.points: deque[Point] = deque(maxlen=max_points)
        self.events: deque[Event] = deque(maxlen=max_events)
        self._alive: dict[str, bool] = {}
        self._leaving: set[str] = set()  # peers whose last status said they are stopping
        self._planner: str | None = None
        self._term = 0
        self._plan_key: tuple[int, int] | None = None
        self._points_plan: tuple[int, int] | None = None  # the plan of the latest point

    def observe(self, status: SwarmStatus, wall: float) -> None:
        self._peer_events(status, wall)
        if status.planner is not None and (status.planner, status.term) != (
            self._planner,
            self._term,
        ):
            self._planner, self._term = status.planner, status.term
            self._add(
                wall,
                "election",
                f"{short(status.planner)} is the planner, term {status.term}",
                status.planner,
            )
        plan = status.plan
        if plan is not None and (plan.term, plan.epoch) != self._plan_key:
            self._plan_key = (plan.term, plan.epoch)
            self._add(wall, "plan", plan_text(plan), plan.planner)
        self._step_points(status, wall)

    def _step_points(self, status: SwarmStatus, wall: float) -> None:
        """A point each time the slowest replica's last stage reports a newer step: that step,
        the mean of the replicas' latest losses (peers gossip only their latest step, a second
        or so apart, so the replicas' reports are rarely of one step) and their summed
        tokens/s. Nothing until every replica has reported.
        Steps only grow within one plan: a lower one under a new plan starts afresh (steps
        re-run after a re-plan), and a step past the run's last (`run_steps`, where the status
        says it) is no step: one replica's lie of a huge step, its own word, stopped the chart
        for the node's life."""
        plan = status.plan
        if plan is None:
            return
        last = {p[-1] for p in plan.pipelines}
        reports = [
            p.metrics
            for p in status.peers
            if p.id in last
            and p.metrics is not None
            and p.metrics.step is not None
            and p.metrics.loss is not None
            and (status.run_steps is None or p.metrics.step < status.run_steps)
        ]
        if not reports or len(reports) < len(last):  # a plan of no pipeline too
            return
        step = min(m.step for m in reports if m.step is not None)
        key = (plan.term, plan.epoch)
        if self.points and (
            step == self.points[-1].step
            or (step < self.points[-1].step and key == self._points_plan)
        ):
            return  # nothing newer
        loss = mean([m.loss for m in reports if m.loss is not None])
        tokens = clamped(sum(m.tokens_per_s or 0.0 for m in reports))
        self.points.append(Point(round(wall, 3), step, loss, tokens))
        self._points_plan = key

    def _peer_events(self, status: SwarmStatus, wall: float) -> None:
        for peer in status.peers:
            was = self._alive.get(peer.id)
            if was is None:
                self._add(wall, "join", f"{short(peer.id)} joined ({peer.role})", peer.id)
            elif was and not peer.alive and (peer.id in self._leaving or said_leaving(peer)):
                self._add(
                    wall, "leave", f"{short(peer.id)} left (it said it was stopping)", peer.id
                )
            elif was and not peer.alive:
                self._add(wall, "death", f"{short(peer.id)} stopped answering", peer.id)
            elif peer.alive and not was:
                self._add(wall, "back", f"{short(peer.id)} is back", peer.id)
        # a node that said it is stopping and then falls silent left; one silent unsaid died
        self._leaving = {p.id for p in status.peers if said_leaving(p)}
        now_alive = {p.id: p.alive for p in status.peers}
        for peer_id in self._alive.keys() - now_alive.keys():
            self._add(wall, "leave", f"{short(peer_id)} left the swarm", peer_id)
        self._alive = now_alive

    def _add(self, wall: float, kind: str, text: str, peer: str | None) -> None:
        self.events.append(Event(round(wall, 3), kind, text, peer))

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [asdict(p) for p in self.points],
            "events": [asdict(e) for e in self.events],
        }


def said_leaving(peer: PeerStatus) -> bool:
    """Did the peer's last word say it is stopping (records/peer.py: Health.leaving)?"""
    return peer.health is not None and peer.health.leaving
