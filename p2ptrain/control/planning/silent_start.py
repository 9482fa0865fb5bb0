"""Members silent in a plan's start agreement, planned around (docs/security.md, row 37.41).

Every member of a plan, spares and donors too, announces its states before any starts
(worker/resume/start_step.py): one that stays alive, says it is healthy and never announces
held every plan's start up for 120 s, after which its mates' sessions failed; their workers
then waited without progress until their own health check called them stuck, the planner
planned around the honest ones, took them back, and the silent one stayed in every plan: the
swarm never trained. A member whose data-plane DHT cannot reach the others does the same
without meaning to.

So each worker says whom its start agreement never heard (records/messages.py StartReport, then
its metrics' `silent` under `silent_plan`), and the planner leaves a member out of its next
plans when a strict majority of the current plan's other members, two at least, name it under
that plan (judged once a plan: when all its peers reported, or JUDGE_AFTER_S after the first
did): a lone liar (or a minority) cannot push an honest member out, and in a plan of two
nobody can tell who is silent. It stays out SILENT_OUT_S, doubled each time again within
FORGIVE_S of the last, at most MAX_OUT_S, then is planned again. Never so many that under half
the plan's peers would be left (a data-plane DHT that fails for everyone makes every member
name every other: no one is singled out then; a split's larger side goes on). The judgement
lives in the planner's memory: a new planner starts afresh.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from p2ptrain.records import PeerMetrics, Plan

log = logging.getLogger(__name__)

SILENT_OUT_S = 600.0
MAX_OUT_S = 4 * SILENT_OUT_S
FORGIVE_S = 2 * MAX_OUT_S  # silent again only this long after the last time: as the first
JUDGE_AFTER_S = 30.0  # a plan's reports are judged this long after its first came in


@dataclass
class SilentStart:
    """Which members are left out of plans for their silence, and until when (monotonic s)."""

    until: dict[str, float] = field(default_factory=dict)
    times: dict[str, int] = field(default_factory=dict)  # how often each was left out
    last: dict[str, float] = field(default_factory=dict)  # when each was last left out
    _judged: set[tuple[int, int]] = field(default_factory=set)  # plans judged (keys)
    _first_report: dict[tuple[int, int], float] = field(default_factory=dict)

    def admit(
        self,
        plan: Plan | None,
        members: Sequence[str],
        reported: Mapping[str, PeerMetrics | None],
        now: float,
    ) -> list[str]:
        """`members` less those left out now, having judged the reports under `plan`."""
        if plan is not None:
            self._judge(plan, reported, now)
            if len(self._first_report) > 64:  # earlier plans' first reports: judged or moot
                self._first_report = {plan.key: self._first_report.get(plan.key, now)}
        for peer in [p for p, t in self.until.items() if t <= now]:
            del self.until[peer]
        return [peer for peer in members if peer not in self.until]

    def _judge(self, plan: Plan, reported: Mapping[str, PeerMetrics | None], now: float) -> None:
        """Once a plan: when every peer of it reported under it, or JUDGE_AFTER_S after the
        first did (reports arrive a tick apart: judged on the first few, a plan whose members
        all named each other lost half of them before the rest came in)."""
        if plan.key in self._judged:
            return
        peers = plan.peers()
        named: dict[str, set[str]] = {}
        accusers = set()
        for accuser in peers:
            metrics = reported.get(accuser)
            if metrics is None or metrics.silent_plan != plan.key:
                continue
            accusers.add(accuser)
            for peer in set(metrics.silent) & peers - {accuser}:
                named.setdefault(peer, set()).add(accuser)
        if not accusers:
            return
        first = self._first_report.setdefault(plan.key, now)
        if accusers != peers and now - first < JUDGE_AFTER_S:
            return
        self._judged.add(plan.key)
        others = len(peers) - 1
        silent = {
            peer: names
            for peer, names in named.items()
            if len(names) >= 2 and 2 * len(names) > others
        }
        left = peers - set(self.until) - set(silent)
        if silent and 2 * len(left) < len(peers):  # everyone names everyone: no one singled out
            log.warning(
                "the members of plan t%d/e%d never heard each other in its start agreement: "
                "planning around none of them",
                *plan.key,
            )
            return
        for peer, names in silent.items():
            if now - self.last.get(peer, -FORGIVE_S) >= FORGIVE_S:
                self.times[peer] = 0
            self.times[peer] = self.times.get(peer, 0) + 1
            self.last[peer] = now
            out_s = min(MAX_OUT_S, SILENT_OUT_S * 2 ** (self.times[peer] - 1))
            self.until[peer] = now + out_s
            log.warning(
                "planning around %s for %.0f s: %d of the %d other members of plan t%d/e%d "
                "never heard it in the start agreement",
                peer,
                out_s,
                len(names),
                others,
                *plan.key,
            )

    def is_out(self, peer: str) -> bool:
        """Is `peer` left out of plans now (a donor too: it would hold the next start up)?"""
        return peer in self.until
