"""Says what this node waits for, and leaves once the run is finished.

Every WAIT_CHECK_S it asks control/waiting.py what the node waits for and says it when the
reason changes (the same reason with new counts: at most every RESAY_S), and again every
STILL_WAITING_S while it lasts, with how long (a planner that never plans left one line on the
terminal for good): a log line on stderr, and for members a line on `join`'s stdout beside the
progress lines. The bootstrap warns again
every NO_PLANNER_WARN_S while no live member holds a planner token (no one may plan: the swarm
never trains).

The run's end (control/run_end.py): when our worker reports the last step, the fact is
gossiped at once (our telemetry), before the worker exits and takes the node down. Every tick
asks whether the run is finished: every placed peer trained its last step or is gone (a live
placed replica that still trains holds the end up: diloco replicas finish at their own pace).
A member that learns the run is finished and has no stage in the plan (a spare, a late joiner)
leaves: its worker is stopped and the node exits 0. A placed member leaves on its own when its
worker finishes; FINISHED_GRACE_S after the run is finished at the latest (never while the run
still waits for a placed replica). The bootstrap stays: its status says finished.
"""

from __future__ import annotations

import logging
import time

import trio

from p2ptrain.control.candidacy import stays
from p2ptrain.control.run_end import placed
from p2ptrain.control.state import NodeState
from p2ptrain.control.waiting import Wait, waiting_for
from p2ptrain.errors import UserError
from p2ptrain.records import PeerMetrics

log = logging.getLogger(__name__)

WATCH_TICK_S = 0.25  # our worker's last step must be gossiped before the worker exits
# the reason is asked for less often: before the first plan it walks the links (a large swarm's
# view holds thousands)
WAIT_CHECK_S = 1.0
RESAY_S = 30.0
STILL_WAITING_S = 60.0
NO_PLANNER_WARN_S = 60.0
FINISHED_GRACE_S = 60.0


class RunWatch:
    """One node's "waiting for" lines and its leaving once the run is finished."""

    def __init__(self, state: NodeState, print_lines: bool = True) -> None:
        """print_lines: say the reasons on stdout too (members: `join`'s progress output)."""
        self.state = state
        self.print_lines = print_lines and state.is_member
        self.said = Wait("", "")
        self.said_at = -float("inf")
        self.waiting_since = 0.0  # when the current kind of wait began
        self.finished_at: float | None = None
        self.checked_at = -float("inf")
        self.revoked_said = False

    async def serve(self) -> None:
        """Run until the node stops (or sets NodeState.stopping once the run is finished)."""
        await self.state.joined.wait()
        while True:
            self.tick(time.monotonic())
            await trio.sleep(WATCH_TICK_S)

    def tick(self, now: float) -> None:
        state, view = self.state, self.state.view
        self._check_revoked()
        if view.run_end.note_metrics(view.run, view.self_id, view.own_metrics, view.plan, True):
            state.publish_soon("telemetry")  # tell the others before our worker exits
        view.run_end.settle(view.run, view.plan, self._metrics_of, lambda p: self._gone(p, now))
        if now - self.checked_at < WAIT_CHECK_S and not view.finished:
            return
        self.checked_at = now
        wait = waiting_for(view, now)
        if not wait.kind and state.is_member:
            wait = self._session_ended(now) or wait
        since_s = now - self.said_at
        changed = wait.kind != self.said.kind or (
            wait.text != self.said.text and since_s >= RESAY_S
        )
        # the organiser's reminder: without a planner-token holder the swarm never trains
        remind = wait.kind == "planner-token" and state.role == "bootstrap"
        still = wait.kind not in ("", "finished") and since_s >= STILL_WAITING_S
        if changed or (remind and since_s >= NO_PLANNER_WARN_S) or still:
            self._say(wait, now)
        if wait.kind == "finished":
            self._leave_if_done(now)

    def _session_ended(self, now: float) -> Wait | None:
        """Placed in the plan, but our worker's session under it ended (a neighbour lost): we
        wait for the next plan, and said nothing (a node's last line stayed `step 1320` for
        minutes while its planner was gone)."""
        view, progress = self.state.view, self.state.worker.progress
        plan = view.plan
        if plan is None or progress is None or progress[2] != "waiting":
            return None
        if (progress[0], progress[1]) != (plan.term, plan.epoch):
            return None  # not started on this plan yet
        key = f"t{plan.term}/e{plan.epoch}"
        if view.planner is not None and stays(view, view.planner, now):
            return Wait("plan", f"a new plan: our pipeline under plan {key} lost a peer")
        return Wait("planner", f"a new planner: plan {key}'s planner is gone, and so is a peer")

    def _check_revoked(self) -> None:
        """The organiser revoked our tokens: in a token run we may not stay (UserError: the
        node exits 2 with the reason; it waited for a plan for good, never told), in an open
        run we train on but never plan (said once)."""
        state, view = self.state, self.state.view
        if self.revoked_said or view.self_id not in view.authority.revocations:
            return
        self.revoked_said = True
        if view.run is not None and view.run.swarm.admission == "token":
            raise UserError(
                f"the organiser revoked this peer's tokens ({view.self_id}): run "
                f"{view.run.run_id} admits token holders only, so this node leaves"
            )
        line = "the organiser revoked this peer's tokens: it trains as a member, never plans"
        log.warning("%s", line)
        if self.print_lines and state.is_member:
            print(line, flush=True)

    def _metrics_of(self, peer: str) -> PeerMetrics | None:
        """A peer's latest metrics (a departed member's stay known until it is forgotten)."""
        view = self.state.view
        if peer == view.self_id:
            return view.own_metrics
        member = view.members.get(peer)
        return None if member is None else member.metrics

    def _gone(self, peer: str, now: float) -> bool:
        """A placed peer that no longer trains: dead, or its worker unhealthy (the planner plans
        around it alike: control/health.py); it holds the run's end up no more."""
        view = self.state.view
        return not (view.is_alive(peer, now) and view.is_healthy(peer))

    def _say(self, wait: Wait, now: float) -> None:
        if wait.kind != self.said.kind:
            self.waiting_since = now
        self.said, self.said_at = wait, now
        waited_s = now - self.waiting_since
        if not wait.kind:
            line = "placed in the plan: training" if self.state.is_member else "the swarm trains"
        elif waited_s >= STILL_WAITING_S:
            line = f"still waiting ({waited_s / 60:.0f} min) for {wait.text}"
        else:
            line = f"waiting for {wait.text}"
        level = logging.WARNING if wait.kind == "planner-token" else logging.INFO
        log.log(level, "%s", line)
        if self.print_lines:
            print(line, flush=True)

    def _leave_if_done(self, now: float) -> None:
        """A finished run: members without a stage leave now, placed ones after a grace."""
        state = self.state
        if not state.is_member or state.stopping.is_set():
            return
        if self.finished_at is None:
            self.finished_at = now
        if placed(state.view.plan, state.peer_id) and now - self.finished_at < FINISHED_GRACE_S:
            return  # our worker ends the node once it has saved the last step
        log.info("the run is finished: nothing left to train, stopping this node")
        if self.print_lines:
            print("the run is finished: stopping", flush=True)
        state.stopping.set()
