"""A stopping node that alone holds a stage hands that stage's state over before it leaves.

A graceful stop (Ctrl-C, SIGTERM) of the only peer placed at a stage used to lose the stage's
training: the node saved its state and left, and the next plan's members agree on a start among
their own states only (worker/resume/start_step.py), so whoever took the stage started it from
initial weights. Now:
- the leaving node says it stops (health `leaving`: control/publishing.py) but stays up;
- the planner keeps it in the next plan as a *donor*: a spare, never placed (`donors_of`), so
  its worker announces its states in that plan's start agreement and serves them to the plan's
  peers like any spare's (worker/resume/state_transfer.py);
- its worker reports "spare" under that plan once the peers that needed a state from it have
  fetched it (worker/resume/handover.py), and the node stops then (`hand_over`): at most
  `limit_s` after the signal (HANDOVER_LIMIT_S, and the time the plan's largest stage state
  takes over its slowest link: schedule/handover_time.py), at once on a second one, or as soon
  as the hand-over cannot happen any more (`_not_worth_waiting`).
No new door: a donor is one more spare of the plan, serving the plan's peers only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection
from pathlib import Path

import trio

from p2ptrain.control.candidacy import stays
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import SwarmView
from p2ptrain.records import Health, Plan, RunSpec

log = logging.getLogger(__name__)

RECHECK_S = 1.0  # our worker's progress is not a change the view notifies: looked at this often
# a planner re-plans within seconds of a leave (debounce, search); one that has not in this
# long is gone or stopping too (a member outside the telemetry audience cannot tell)
NEXT_PLAN_WAIT_S = 30.0
WORKER_GONE_S = 10.0  # our worker's heartbeats come every 2 s: silent this long, it is gone

IDLE_PHASES = ("spare", "waiting")  # a worker's phase once its spare's session is over
Progress = tuple[int, int, str, int]  # the worker's (term, epoch, phase, step): control/health.py


def holds_alone(plan: Plan, peer: str, staying: Callable[[str], bool]) -> bool:
    """Does `plan` place `peer` at a stage where no other peer that stays is placed?"""
    for pipeline in plan.pipelines:
        if peer in pipeline:
            stage = pipeline.index(peer)
            return not any(staying(p[stage]) for p in plan.pipelines if p[stage] != peer)
    return False


def blocks_of(plan: Plan, peer: str, run: RunSpec) -> tuple[int, int] | None:
    """The blocks [first, end) of the stage `plan` places `peer` at (None: not placed, or a
    plan that does not fit the run's model)."""
    for pipeline in plan.pipelines:
        if peer in pipeline:
            try:
                blocks = plan.layer_ranges(run.model.n_layer)[pipeline.index(peer)]
            except ValueError:
                return None
            return blocks.start, blocks.stop
    return None


def donors_of(
    view: SwarmView, plan: Plan | None, members: Collection[str], now: float
) -> list[str]:
    """The planner's donors for the plan after `plan`: live peers that said they are stopping,
    not yet that they exit, and that `plan` placed at a stage none of `members` (the peers
    planned now) holds. A planner that takes the role over mid-hand-over keeps none of its
    predecessor's donors (a donor that has just left still looks alive for DEAD_AFTER_S, and a
    plan naming a dead peer holds every worker's connect up for its dial window): such a donor
    stops, its hand-over perhaps cut short."""
    if plan is None:
        return []
    staying = set(members)

    def stopping(peer: str) -> bool:
        health = _health(view, peer)
        leaving = health is not None and health.leaving and not (health.left or health.quits)
        return leaving and peer != view.self_id and view.is_alive(peer, now)

    placed = [peer for pipeline in plan.pipelines for peer in pipeline]
    alone = [p for p in placed if p not in staying and holds_alone(plan, p, staying.__contains__)]
    return sorted(peer for peer in alone if stopping(peer))


def limit_s(run: RunSpec | None, plan: Plan | None) -> float:
    """How long a hand-over under `plan` may take (schedule/handover_time.py: pure Python, its
    package loads numpy only for the names that need it; imported when a hand-over needs it,
    so a control process that never plans nor stops holds none of the scheduler)."""
    from p2ptrain.schedule.handover_time import handover_limit_s

    return handover_limit_s(run, plan)


def tell_supervisor(limit_file: Path | None, seconds: float) -> None:
    """The supervisor bounds the node's stop by the hand-over's limit: it reads it here."""
    if limit_file is not None:
        with contextlib.suppress(OSError):
            limit_file.write_text(f"{seconds:.1f}")


class Donors:
    """The donors the planner's plans keep, each since the plan that first kept it. One that
    says it exits (its hand-over done) is forgotten: the plan may name it until the next one,
    which no worker waits on. One gone without a word, or kept its hand-over's limit (a peer that
    says it stops but stays is a spare no longer than its hand-over may take), is dropped by a
    re-issue of the plan: a donor that never announced would hold the start agreement up; so
    is one that says it exits without handing its stage over (a second signal, its time
    limit), at once."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._blocks: dict[str, tuple[int, int]] = {}  # the stage each hands over: its blocks

    def review(
        self, view: SwarmView, plan: Plan | None, members: Collection[str], now: float
    ) -> tuple[list[str], list[str]]:
        """(the donors the next plan keeps, those to re-issue the plan without) as of `now`."""
        current = None if plan is None else plan.key

        def last_word(peer: str) -> Health:
            return _health(view, peer) or Health(True)

        # done under the plan that names it now (or it does not say: an older peer)
        self._since = {
            peer: t
            for peer, t in self._since.items()
            if not (last_word(peer).left and last_word(peer).plan in (None, current))
        }
        # a donor that said it handed over under another plan than this one, which names it
        # still (made before its word came), is re-issued out: no worker may wait on it
        gone = sorted(
            peer
            for peer, since in self._since.items()
            if not view.is_alive(peer, now)
            or now - since > limit_s(view.run, plan)
            or last_word(peer).quits
            or last_word(peer).left
        )
        kept = {peer for peer in self._since if peer not in gone}
        new = [peer for peer in donors_of(view, plan, members, now) if peer not in kept]
        for peer in new:  # the plan that placed it says which blocks it hands over
            blocks = None if plan is None or view.run is None else blocks_of(plan, peer, view.run)
            if blocks is not None:
                self._blocks[peer] = blocks
        return sorted(kept | set(new)), gone

    def blocks_of(self, donors: Collection[str]) -> dict[str, tuple[int, int]]:
        """The blocks each of `donors` hands over (Plan.donor_blocks), where known."""
        return {peer: self._blocks[peer] for peer in donors if peer in self._blocks}

    def kept(self, donors: Collection[str], now: float) -> None:
        """A plan keeping `donors` is published at `now`."""
        self._since = {peer: self._since.get(peer, now) for peer in donors}
        self._blocks = {peer: b for peer, b in self._blocks.items() if peer in self._since}


def _health(view: SwarmView, peer: str) -> Health | None:
    """What `peer` last said of its worker (leaving, left: Publisher), None if nothing."""
    member = view.members.get(peer)
    return None if member is None else member.health


def successor_possible(view: SwarmView, placed_key: tuple[int, int], now: float) -> bool:
    """Could the stage still pass to someone? Before a later plan: a staying member to take
    it and a staying candidate (not us) to plan it; once one is here, a staying peer it places
    (every other peer stopping at once, as `p2ptrain local` stops a swarm, leaves none)."""
    me, plan = view.self_id, view.plan
    if plan is not None and plan.key != placed_key:
        return any(p != me and stays(view, p, now) for pipe in plan.pipelines for p in pipe)
    takers = [p for p in plannable_members(view, now) if p != me]
    planners = [p for p in view.members if p != me and view.may_plan(p) and stays(view, p, now)]
    return bool(takers and planners)


def handed_over(view: SwarmView, placed_key: tuple[int, int], progress: Progress | None) -> bool:
    """Is the hand-over done? A later plan than the one that placed us either leaves us out
    (nothing to hand over) or keeps us as a spare, and our worker is done with its spare's
    session under it ("spare", then "waiting" again): the peers that needed our states have
    them (worker/resume/handover.py). A later plan that places us again was made before our
    word arrived: the next one decides."""
    plan, me = view.plan, view.self_id
    if plan is None or plan.key == placed_key or any(me in pipe for pipe in plan.pipelines):
        return False
    if me not in plan.spares:
        return True
    return progress is not None and progress[:2] == plan.key and progress[2] in IDLE_PHASES


async def hand_over(
    state: NodeState, hurry: trio.Event, limit_file: Path | None = None
) -> tuple[int, int] | None:
    """If our worker alone holds its stage, stay until the next plan's peers have its state
    (the module's docstring); `hurry` (a second signal) ends the wait. The plan that kept us as
    a donor, if we handed the state over under it (our last word names it:
    Publisher.announce_exit); None otherwise. `limit_file`: where the supervisor reads the
    wait's limit."""
    view, me, started = state.view, state.view.self_id, state.clock()
    plan = view.plan
    staying = set(plannable_members(view, started)) - {me}
    if (
        plan is None
        or view.finished
        or not state.worker.heard_at
        or not holds_alone(plan, me, staying.__contains__)
        or not successor_possible(view, plan.key, started)
    ):
        return None
    limit_s_here = limit_s(view.run, plan)
    tell_supervisor(limit_file, limit_s_here)
    log.info(
        "stopping: this node alone holds its stage of plan t%d/e%d: handing the stage's state "
        "to the next plan first (up to %.0f s; signal again to stop now)",
        plan.term,
        plan.epoch,
        limit_s_here,
    )
    seen = state.changes.count("plan", "members")
    with trio.move_on_after(limit_s_here) as limit:
        while not hurry.is_set():
            now = state.clock()
            if handed_over(view, plan.key, state.worker.progress):
                log.info("the stage's state is handed over: stopping")
                kept = view.plan is not None and me in view.plan.spares
                return view.plan.key if kept and view.plan is not None else None
            if (why := _not_worth_waiting(state, plan.key, started, now)) is not None:
                log.info("%s: stopping without handing the stage over", why)
                return None
            seen = await state.changes.wait(("plan", "members"), seen, RECHECK_S)
        log.info("signalled again: stopping without handing the stage over")
    if limit.cancelled_caught:
        log.warning(
            "the stage's state was not handed over within %.0f s: stopping (its checkpoint stays "
            "in this node's checkpoint directory)",
            limit_s_here,
        )
    return None


def _not_worth_waiting(
    state: NodeState, placed_key: tuple[int, int], started: float, now: float
) -> str | None:
    """Why the hand-over cannot happen any more, or None while it still may."""
    view = state.view
    if view.finished:
        return "the run is finished"
    if not successor_possible(view, placed_key, now):
        return "no peer is left to take the stage"
    if view.plan is not None and view.plan.key == placed_key and now - started > NEXT_PLAN_WAIT_S:
        return f"no plan came within {NEXT_PLAN_WAIT_S:.0f} s"
    heard = state.worker.heard_at
    if heard is None or now - heard > WORKER_GONE_S:
        return "our worker is gone"
    return None
