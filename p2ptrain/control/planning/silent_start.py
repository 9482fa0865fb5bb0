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
that plan: a lone liar (or a minority) cannot push an honest member out, and in a plan of two
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


@dataclass
class SilentStart:
    """Which members are left out of plans for their silence, and until when (monotonic s)."""

    until: dict[str, float] = field(default_factory=dict)
    times: dict[str, int] = field(default_factory=dict)  # how often each was left out
    last: dict[str, float] = field(default_factory=dict)  # when each was last left out
    _judged: set[tuple[tuple[int, int], str]] = field(default_factory=set)

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
        for peer in [p for p, t in self.until.items() if t <= now]:
            del self.until[peer]
        return [peer for peer in members if peer not in self.until]

    def _judge(self, plan: Plan, reported: Mapping[str, PeerMetrics | None], now: float) -> None:
        peers = plan.peers()
        named: dict[str, set[str]] = {}
        for accuser in peers:
            metrics = reported.get(accuser)
            if metrics is None or metrics.silent_plan != plan.key:
                continue
            for peer in set(metrics.silent) & peers - {accuser}:
                named.setdefault(peer, set()).add(accuser)
        others = len(peers) - 1
        silent = {
            peer: accusers
            for peer, accusers in named.items()
            if len(accusers) >= 2
            and 2 * len(accusers) > others
            and (plan.key, peer) not in self._judged
        }
        left = peers - set(self.until) - set(silent)
        if silent and 2 * len(left) < len(peers):  # everyone names everyone: no one singled out
            log.warning(
                "the members of plan t%d/e%d never heard each other in its start agreement: "
                "planning around none of them",
                *plan.key,
            )
            silent = {}
        for peer, accusers in silent.items():
            self._judged.add((plan.key, peer))  # one judgement a plan
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
                len(accusers),
                others,
                *plan.key,
            )
        if len(self._judged) > 4096:  # old plans' judgements: each is judged once anyway
            self._judged = {k for k in self._judged if k[0] == plan.key}
