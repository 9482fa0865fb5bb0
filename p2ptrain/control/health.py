"""The health of this node's worker: does it make progress? (issue 11, attack 7)

A frozen worker behind a live control process would stall its pipeline for good: its neighbours
give up and wait for a re-plan that never comes. So the control process watches what its worker
sends over the socket (records/messages.py: a `heartbeat` every few seconds from the worker's own
thread, `metrics` after every step), publishes its verdict in its telemetry (records/peer.py
`Health`), and the planner plans only healthy peers (plan_inputs.plannable_members).

With B = max(run.swarm.worker_stall_s, BOUND_STEPS x the current plan's predicted step time cost_s):
- silent: nothing from the worker for B (counted from the node's start if it never spoke, as a
  control-only node never does) -> unhealthy, placed in a plan or not, until it speaks again;
- stuck: placed in the plan's pipelines and speaking, but its progress (plan, phase, step) has
  not changed for STUCK_FACTOR x B since that plan placed it -> unhealthy until it moves or the
  plan leaves it out.
A stuck verdict waits longer than a silent one: a frozen worker's neighbours are stuck too, and
must not be judged before the frozen one is planned around (the new plan frees them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import trio

from p2ptrain.control.view import SwarmView
from p2ptrain.records import Health, Plan
from p2ptrain.records.peer import LEAVING_REASON, LEFT_REASON, QUIT_REASON

log = logging.getLogger(__name__)

BOUND_STEPS = 10  # the bound is at least this many predicted steps
STUCK_FACTOR = 3
HEALTH_TICK_S = 1.0
HEALTHY = Health(True)
LEAVING = Health(False, LEAVING_REASON)
LEFT = Health(False, LEFT_REASON)  # after a hand-over: its donor is dropped at once
QUIT = Health(False, QUIT_REASON)  # exits, no hand-over done: a donor's plan is re-issued

Progress = tuple[int, int, str, int]  # (term, epoch, phase, step)


def health_bound_s(floor_s: float, cost_s: float) -> float:
    """How long a worker may stay silent: the run's floor or BOUND_STEPS predicted steps."""
    return max(floor_s, BOUND_STEPS * cost_s)


@dataclass
class WorkerWatch:
    """What this node's worker said last, and when; the clock is passed in (monotonic s)."""

    started_at: float
    heard_at: float | None = None
    progress: Progress | None = None
    moved_at: float = float("-inf")  # when `progress` last changed
    placed_key: tuple[int, int] | None = None  # the plan that places us, since placed_at
    placed_at: float = float("-inf")
    # what the node says as it stops, repeated until it is gone (the planner acts on it):
    # LEAVING (Publisher.announce_leaving), then LEFT or QUIT (Publisher.announce_exit)
    last_word: Health | None = None

    def heard(self, now: float, progress: Progress) -> None:
        """A message from the worker, with the progress it shows."""
        self.heard_at = now
        if progress != self.progress:
            self.progress, self.moved_at = progress, now

    def judge(self, now: float, plan: Plan | None, self_id: str, floor_s: float) -> Health:
        """This node's health now, under `plan` (floor_s <= 0: the check is off)."""
        if self.last_word is not None:
            return self.last_word
        if floor_s <= 0:
            return HEALTHY
        bound_s = health_bound_s(floor_s, plan.cost_s if plan is not None else 0.0)
        silent_s = now - (self.started_at if self.heard_at is None else self.heard_at)
        if silent_s > bound_s:
            who = "no worker spoke" if self.heard_at is None else "the worker is silent"
            return Health(False, f"{who} for {silent_s:.0f} s (bound {bound_s:.0f} s)")
        if plan is None or not any(self_id in pipeline for pipeline in plan.pipelines):
            self.placed_key = None
            return HEALTHY
        if plan.key != self.placed_key:
            self.placed_key, self.placed_at = plan.key, now
        still_s = now - max(self.moved_at, self.placed_at)
        if still_s > STUCK_FACTOR * bound_s:
            phase = "?" if self.progress is None else f"{self.progress[2]} step {self.progress[3]}"
            return Health(
                False,
                f"the worker made no progress for {still_s:.0f} s ({phase}; bound "
                f"{STUCK_FACTOR * bound_s:.0f} s)",
            )
        return HEALTHY


async def serve_health(
    view: SwarmView,
    watch: WorkerWatch,
    publish_soon: Callable[[Literal["telemetry"]], None],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Judge our worker every HEALTH_TICK_S; a changed verdict is logged and published at once."""
    while True:
        floor_s = view.run.swarm.worker_stall_s if view.run is not None else 0.0
        health = watch.judge(clock(), view.plan, view.self_id, floor_s)
        if health.ok != view.own_health.ok:
            if health.ok:
                log.info("our worker is healthy again")
            else:
                log.warning("our worker is unhealthy: %s", health.reason)
            publish_soon("telemetry")
        view.own_health = health
        await trio.sleep(HEALTH_TICK_S)
