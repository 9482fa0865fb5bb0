"""The paced publisher that re-broadcasts what this node authors (the signed messages
themselves: control/authored.py).

Each message re-states its author's full current state, so re-publishing them periodically is
anti-entropy: the next copy heals a lost one. The schedule is NodeState.due; the publisher sleeps
until the next message is due, and other pieces call NodeState.publish_soon (which wakes it:
control/events.py) when something worth announcing changed.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from functools import partial

import trio
from libp2p.pubsub.pubsub import Pubsub

from p2ptrain.control.authored import (
    INLINE_PLAN_BYTES,
    claim_message,
    own_plan_bytes,
    own_record,
    plan_message,
    record_message,
    revocation_messages,
    run_message,
    telemetry_message,
)
from p2ptrain.control.gossip import CONTROL_TOPIC, TELEMETRY_TOPIC
from p2ptrain.control.hardware import measure_compute_gflops_in_child
from p2ptrain.control.health import LEAVING, LEFT, QUIT
from p2ptrain.control.membership import (
    DEAD_AFTER_S,
    STEADY_DEAD_AFTER_S,
    record_renew_s,
)
from p2ptrain.control.revocation_file import reload_revocations
from p2ptrain.control.state import MIN_REPUBLISH_GAP_S, Kind, NodeState
from p2ptrain.records import Health, PeerRecord

log = logging.getLogger(__name__)

TELEMETRY_INTERVAL_S = 2.0
# a member's, the planner's excepted, in a large swarm (a sampled neighbour set:
# control/estimate/book.py) once the plan stood STEADY_AFTER_S, as bench control simulates:
# telemetry's audience takes every member's (at 32 peers on one machine the 3 candidates and the
# bootstrap used 0.45 of the swarm's ~1.5 cores). The audience allows the slower pace's silence
# (STEADY_DEAD_AFTER_S) a little sooner than members slow down; a new plan puts both back
STEADY_TELEMETRY_INTERVAL_S = 4.0
STEADY_SILENCE_EARLIER_S = 10.0
RECORD_INTERVAL_S = 6.0
# a member's record unchanged since we last published it waits record_renew_s (control/
# membership.py: UNCHANGED_RECORD_S, slower past 120 members): the member's telemetry (every
# 2 s) proves it alive to telemetry's audience, a changed record goes out at once, and sync
# serves the record to a node that missed it (a pulled record may be PULLED_RECORD_MAX_AGE_S
# old: control/sync.py). Every member's record is a flood to all: at 12 s, 32 members' records
# were most of a member's gossip; at 60 s still a third of what a member relayed in steady state
RUN_INTERVAL_S = 10.0
# the organiser's run spec and a non-member's record (its proof of life: it sends no telemetry),
# once the plan stood STEADY_AFTER_S: each is a flood every node receives and relays, and at 32
# peers the bootstrap's record (every 6 s) and run (every 10 s) were over a third of a member's
# floods in steady state. Sync serves both to a node that missed them; a changed record or newly
# revoked peers still go out at once (control/membership.py: NON_MEMBER_DEAD_AFTER_S)
STEADY_RUN_INTERVAL_S = 30.0
CLAIM_INTERVAL_S = 2.0
PLAN_REBROADCAST_S = 4.0
# once our plan has stood unchanged this long, its claim and the plan itself go out less often:
# sync serves both to a node that missed them (a fresh node's first sync pulls them at once),
# and each copy is relayed by every node. The claim is also the planner's proof of life to the
# nodes outside telemetry's audience (our telemetry, like everyone's, goes to the audience
# only: control/gossip.py): they call us dead after PLANNER_DEAD_AFTER_S of no claim (a claim
# is a tenth of a telemetry message's bytes; the planner's telemetry, ~2 kB every 2 s relayed by
# every node, would be ~10 kB/s per node at 1,000 peers)
STEADY_AFTER_S = 30.0
STEADY_CLAIM_INTERVAL_S = 6.0
STEADY_PLAN_REBROADCAST_S = 30.0
# a large plan (O(N) bytes) is re-sent no faster than PLAN_RESEND_BYTES_PER_S of its bytes a
# second (every node relays each copy), at least every MAX_PLAN_REBROADCAST_S; sync serves it
# to a node that missed it (a pulled plan may be PULLED_PLAN_MAX_AGE_S old: sync.py)
PLAN_RESEND_BYTES_PER_S = 200.0
MAX_PLAN_REBROADCAST_S = 600.0
PUBLISH_GAP_S = 0.02  # pace publishes: py-libp2p drops bursts past its 32-slot queues
REVOCATION_PAGES_PER_ROUND = 8  # gossiped per run interval: the last page and others in turn


def telemetry_pace(
    sampled: bool, plan_stood_s: float | None, planner: bool = False
) -> tuple[float, float]:
    """(how often we publish telemetry, how long a peer heard by its telemetry may be silent)
    in a swarm that is `sampled` (large) or not, its current plan unchanged for `plan_stood_s`
    (None: no plan); the `planner` keeps the fast pace (a failover starts from its silence)."""
    if not sampled or plan_stood_s is None:
        return TELEMETRY_INTERVAL_S, DEAD_AFTER_S
    slow = plan_stood_s >= STEADY_AFTER_S and not planner
    silent = plan_stood_s >= STEADY_AFTER_S - STEADY_SILENCE_EARLIER_S
    return (
        STEADY_TELEMETRY_INTERVAL_S if slow else TELEMETRY_INTERVAL_S,
        STEADY_DEAD_AFTER_S if silent else DEAD_AFTER_S,
    )


def plan_resend_s(pace_s: float, plan_bytes: int) -> float:
    """How long until our plan of `plan_bytes` goes out again, at a pace of `pace_s` for a
    small one."""
    return min(MAX_PLAN_REBROADCAST_S, max(pace_s, plan_bytes / PLAN_RESEND_BYTES_PER_S))


async def measure_compute(state: NodeState) -> None:
    """Measure our compute once (in a child process: control/hardware.py) and announce it in
    our record."""
    state.compute_gflops = await measure_compute_gflops_in_child()
    state.publish_soon("record")


class Publisher:
    """Publishes each of our messages when due, paced, for as long as the node runs."""

    def __init__(self, state: NodeState, pubsub: Pubsub) -> None:
        self.state = state
        self.pubsub = pubsub
        self._next_revocation_page = 0  # the older pages are gossiped in turn
        self._published_record: tuple[PeerRecord, float] | None = None  # and when
        self._plan_since: tuple[int, float] = (-1, 0.0)  # the view's plan version, since when
        self._run_published_at = -math.inf  # the organiser's run spec, last sent
        self._slow_until = 0.0  # the slow pace's silence allowed until then (_allow_silence)

    def _due_now(self, name: Kind, interval_s: float, now: float) -> bool:
        """True if `name` is due; then schedules its next time, jittered so peers drift apart."""
        if now < self.state.due.get(name, 0.0):
            return False
        self.state.due[name] = now + interval_s * random.uniform(0.9, 1.1)
        self.state.sent_at[name] = now
        return True

    async def _publish(self, topic: str, make: Callable[[], bytes]) -> None:
        try:
            await self.pubsub.publish(topic, make())
        except Exception as exc:
            log.info("publish on %s failed: %s", topic, exc)
        await trio.sleep(PUBLISH_GAP_S)

    async def _publish_revocations(self) -> None:
        """The last page of revocations (where new ones go) and a few older ones in turn: the
        gossip of a long list stays bounded per round, and sync serves every page."""
        messages = revocation_messages(self.state)
        older = messages[:-1]
        chosen = [messages[-1]]
        for i in range(min(len(older), REVOCATION_PAGES_PER_ROUND - 1)):
            chosen.append(older[(self._next_revocation_page + i) % len(older)])
        self._next_revocation_page += REVOCATION_PAGES_PER_ROUND - 1
        for data in chosen:
            await self._publish(CONTROL_TOPIC, partial(bytes, data))

    async def announce_leaving(self) -> None:
        """Tell the others we are stopping (a signal, a finished run): our telemetry says we
        are unhealthy, so the planner plans around us now, not after DEAD_AFTER_S of silence."""
        await self._last_word(LEAVING)

    async def announce_exit(self, handed_over_under: tuple[int, int] | None) -> None:
        """Our last telemetry as the node exits: after a hand-over under a plan (control/
        handover.py) LEFT naming it (a planner that kept us as a donor forgets us), else QUIT
        (it re-issues its plan without us)."""
        word = QUIT if handed_over_under is None else Health(False, LEFT.reason, handed_over_under)
        await self._last_word(word)

    async def _last_word(self, health: Health) -> None:
        """Our telemetry saying `health`, now (a member's only), kept to the 1 s floor between
        two telemetry messages (MIN_REPUBLISH_GAP_S); the health check repeats it from now on."""
        state = self.state
        if not state.is_member or not state.joined.is_set():
            return
        state.view.own_health = state.worker.last_word = health
        last = state.sent_at.get("telemetry")
        if last is not None:
            await trio.sleep(max(0.0, last + MIN_REPUBLISH_GAP_S - state.clock()))
        log.info("telling the others: %s", health.reason)
        state.sent_at["telemetry"] = state.clock()
        await self._publish(TELEMETRY_TOPIC, partial(telemetry_message, state))

    async def serve_publishing(self) -> None:
        """Publish our state, paced; every message re-states everything we author (anti-entropy).
        Sleeps until the next message is due or NodeState.publish_soon moves one forward."""
        state, view = self.state, self.state.view
        await state.joined.wait()
        while True:
            seen = state.changes.count("publish")
            now = state.clock()
            if self._due_now("record", RECORD_INTERVAL_S, now) and self._record_worth_it(now):
                await self._publish(CONTROL_TOPIC, partial(record_message, state))
            if state.role == "bootstrap" and self._due_now("run", RUN_INTERVAL_S, now):
                known = set(view.authority.revocations)
                reload_revocations(state)
                revoked = set(view.authority.revocations) != known
                if revoked or self._run_worth_it(now):
                    self._run_published_at = now
                    await self._publish(CONTROL_TOPIC, partial(run_message, state))
                    if view.authority.revocations:
                        await self._publish_revocations()
            stood_s = self._plan_stood_s(now) if view.plan is not None else None
            planner = view.planner == state.peer_id
            telemetry_s, silence_s = telemetry_pace(view.links.estimate.sampled, stood_s, planner)
            self._allow_silence(silence_s, now)
            if state.is_member and self._due_now("telemetry", telemetry_s, now):
                await self._publish(TELEMETRY_TOPIC, partial(telemetry_message, state))
            if view.planner == state.peer_id:  # again: the view may change while we publish
                steady = self._plan_steady(now)
                claim_s = STEADY_CLAIM_INTERVAL_S if steady else CLAIM_INTERVAL_S
                if self._due_now("claim", claim_s, now):
                    await self._publish(CONTROL_TOPIC, partial(claim_message, state))
                plan_s = STEADY_PLAN_REBROADCAST_S if steady else PLAN_REBROADCAST_S
                if self._own_plan() and self._due_now("plan", plan_s, now):
                    size = own_plan_bytes(state)
                    if size > INLINE_PLAN_BYTES:  # our claim names it instead
                        await self._publish(CONTROL_TOPIC, partial(claim_message, state))
                        state.due["plan"] = now + MAX_PLAN_REBROADCAST_S
                    else:
                        await self._publish(CONTROL_TOPIC, partial(plan_message, state))
                        resend_at = now + plan_resend_s(plan_s, size)
                        state.due["plan"] = max(state.due["plan"], resend_at)
            view.forget_stale(now)  # the view's housekeeping rides on our rounds
            now = state.clock()
            await state.changes.wait(("publish",), seen, self._next_due(now) - now)

    def _record_worth_it(self, now: float) -> bool:
        """Publish our record now? Yes if it changed or if record_renew_s passed; a
        non-member's (its proof of life) every RECORD_INTERVAL_S, STEADY_RUN_INTERVAL_S once
        the plan stood."""
        record = own_record(self.state)
        last = self._published_record
        if self.state.is_member:
            wait_s = record_renew_s(len(self.state.view.members) + 1)
        else:
            wait_s = STEADY_RUN_INTERVAL_S if self._swarm_steady(now) else 0.0
        if last is not None and last[0] == record and now - last[1] < wait_s:
            return False
        self._published_record = (record, now)
        return True

    def _run_worth_it(self, now: float) -> bool:
        """Re-state the run spec now? Every RUN_INTERVAL_S, STEADY_RUN_INTERVAL_S once the
        plan stood."""
        wait_s = STEADY_RUN_INTERVAL_S if self._swarm_steady(now) else 0.0
        return now - self._run_published_at >= wait_s

    def _swarm_steady(self, now: float) -> bool:
        """Has the view's plan (anyone's) stood unchanged for STEADY_AFTER_S?"""
        return self.state.view.plan is not None and self._plan_stood_s(now) >= STEADY_AFTER_S

    def _allow_silence(self, silence_s: float, now: float) -> None:
        """How long a peer heard by its telemetry may be silent: a longer allowance at once, a
        shorter one only STEADY_DEAD_AFTER_S after the longer was last due (a member at the slow
        pace takes a while to hear the new plan that puts it back on the fast one)."""
        members = self.state.view.members
        if silence_s >= members.telemetry_silence_s or now >= self._slow_until:
            members.telemetry_silence_s = silence_s
        if silence_s >= STEADY_DEAD_AFTER_S:
            self._slow_until = now + STEADY_DEAD_AFTER_S

    def _plan_steady(self, now: float) -> bool:
        """Has our own plan stood unchanged for STEADY_AFTER_S?"""
        return self._own_plan() and self._plan_stood_s(now) >= STEADY_AFTER_S

    def _plan_stood_s(self, now: float) -> float:
        """How long the view's plan has stood unchanged (as far as we have seen it)."""
        version = self.state.view.plan_version
        if version != self._plan_since[0]:
            self._plan_since = (version, now)
        return now - self._plan_since[1]

    def _own_plan(self) -> bool:
        """Do we hold a plan of ours for our current term (ours to re-broadcast)?"""
        view = self.state.view
        plan = view.plan
        return plan is not None and plan.planner == self.state.peer_id and plan.term == view.term

    def _next_due(self, now: float) -> float:
        """When the next of the messages we author now is due (kinds we do not author at
        the moment, such as a deposed planner's claim, wait for publish_soon)."""
        state = self.state
        kinds: list[Kind] = ["record"]
        if state.role == "bootstrap":
            kinds.append("run")
        if state.is_member:
            kinds.append("telemetry")
        if state.view.planner == state.peer_id:
            kinds += ["claim", "plan"] if self._own_plan() else ["claim"]
        return min(state.due.get(kind, now) for kind in kinds)
