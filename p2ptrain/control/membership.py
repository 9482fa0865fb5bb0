"""The other peers one view knows, by peer id: each one's record, when we last heard it, its
metrics and its worker's health, and how long a silence means death. Pure, with monotonic time
passed in; the view's `members` part (the view adds itself, tokens and penalties)."""

from __future__ import annotations

import logging
from collections.abc import Callable, ItemsView, Iterator, MutableMapping, ValuesView
from dataclasses import dataclass

from p2ptrain.control.delivery_lag import DeliveryLag
from p2ptrain.control.loop_stall import LoopStall
from p2ptrain.records import Health, PeerMetrics, PeerRecord
from p2ptrain.records.fields import MAX_PEERS
from p2ptrain.records.peer import MEMBER_ROLES, PROTOCOL_LEVEL
from p2ptrain.sampled_log import SampledLog

_other_levels = SampledLog(logging.getLogger(__name__), logging.WARNING)

DEAD_AFTER_S = 8.0  # members publish telemetry every 2 s: four missed rounds => dead
# ... every 4 s in a large swarm's steady state (control/publishing.py: telemetry_pace)
STEADY_DEAD_AFTER_S = 16.0
# a member re-states its unchanged record this often (control/publishing.py), and slower in a
# swarm so large that this would flood more than SWARM_RECORDS_PER_S records a second: each is
# a flood every node relays, so at a fixed pace their bytes per node would grow with the swarm
# (1,000 members: 8 records a second, ~33 kB/s a node with their copies; bench control)
UNCHANGED_RECORD_S = 120.0
SWARM_RECORDS_PER_S = 1.0
# a node outside telemetry's audience (the planner candidates and the bootstrap: control/gossip.py)
# hears every peer but the planner by its record only: three missed => dead (360 s up to 120
# members, record_renew_s beyond)
RECORD_DEAD_AFTER_S = 3 * UNCHANGED_RECORD_S
# ... and the planner by its claims, re-sent every 6 s once its plan stood (every 2 s before):
# three missed => dead
PLANNER_DEAD_AFTER_S = 20.0
# a non-member (the bootstrap, an observer) by its record, every 30 s once the plan stood
# (control/publishing.py: STEADY_RUN_INTERVAL_S): three missed => dead
NON_MEMBER_DEAD_AFTER_S = 90.0
FORGET_DEAD_AFTER_S = 600.0  # times record_pace in a large swarm
# the most members the record pace counts: a plan names at most MAX_PEERS peers, so no run
# plans a larger swarm, and records from throwaway identities (free in an open run) must not
# stretch every allowance that counts in re-statements (forgetting the dead: 600 s times
# N / 120) without bound. Renewal is capped alike, so that live members still re-state their
# records well inside the capped allowances (every 1,024 s at most, forgotten after 5,120 s).
PACED_MEMBERS_CAP = MAX_PEERS


def _same_level(record: PeerRecord) -> bool:
    return record.protocol is None or record.protocol == PROTOCOL_LEVEL


def record_renew_s(num_members: int) -> float:
    """How often a member re-states its unchanged record in a swarm of `num_members`."""
    return max(UNCHANGED_RECORD_S, min(num_members, PACED_MEMBERS_CAP) / SWARM_RECORDS_PER_S)


def record_pace(num_members: int) -> float:
    """How much slower than UNCHANGED_RECORD_S records are re-stated (1 up to 120 members): the
    allowances that count in re-statements (dead, forgotten, a pulled record's age) scale by it."""
    return record_renew_s(num_members) / UNCHANGED_RECORD_S


@dataclass
class Member:
    """What we know about one other peer."""

    record: PeerRecord
    last_heard: float
    metrics: PeerMetrics | None = None
    health: Health | None = None  # its worker's, as it reports it (None: taken as ok)


class Membership(MutableMapping[str, Member]):
    """A table of members (a mapping peer -> Member) and the liveness rules over it."""

    def __init__(self) -> None:
        self._by_peer: dict[str, Member] = {}
        # told of each peer removed (forgotten, revoked, not admitted): what others hold of it
        # goes too (control/intake.py: what we keep for sync; control/traversal.py: its routes)
        self._forget_hooks: list[Callable[[str], None]] = []
        self.delivery_lag = DeliveryLag()  # widens DEAD_AFTER_S (control/delivery_lag.py)
        self.loop_stall = LoopStall()  # ... and so do our own stalls (control/loop_stall.py)
        # how long a peer heard by its telemetry may be silent (set by telemetry's pace)
        self.telemetry_silence_s = DEAD_AFTER_S

    def __getitem__(self, peer: str) -> Member:
        return self._by_peer[peer]

    def __setitem__(self, peer: str, member: Member) -> None:
        if peer not in self._by_peer and not _same_level(member.record):
            _other_levels.event(
                "level",
                "member %s runs p2ptrain %s at protocol level %d, ours %d: never planned with "
                'members of ours (docs/operations.md, "Upgrades")',
                peer,
                member.record.version,
                member.record.protocol,
                PROTOCOL_LEVEL,
            )
        self._by_peer[peer] = member

    def __delitem__(self, peer: str) -> None:
        del self._by_peer[peer]
        for hook in self._forget_hooks:
            hook(peer)

    def when_forgotten(self, hook: Callable[[str], None]) -> None:
        """Call `hook(peer)` each time a peer is removed."""
        self._forget_hooks.append(hook)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_peer)

    def __len__(self) -> int:
        return len(self._by_peer)

    # the dict's own views and lookup: MutableMapping's generic ones go through __getitem__
    def items(self) -> ItemsView[str, Member]:
        return self._by_peer.items()

    def values(self) -> ValuesView[Member]:
        return self._by_peer.values()

    def __contains__(self, peer: object) -> bool:
        return peer in self._by_peer

    def dead_after_s(self, now: float) -> float:
        """How long a member may stay silent before we call it dead: DEAD_AFTER_S, plus how late
        gossip reaches us now (a busy machine hears everyone late: control/delivery_lag.py),
        plus how long our own loop stood still lately (control/loop_stall.py)."""
        return DEAD_AFTER_S + self.delivery_lag.extra_s(now) + self.loop_stall.extra_s(now)

    def heard_lately(
        self, peer: str, now: float, in_audience: bool = True, planner: bool = False
    ) -> bool:
        """Is `peer` a member we heard from lately, with dead_after_s's allowances? In
        telemetry's audience we hear everyone by telemetry (the planner's always at the fast
        pace: a failover starts from its silence), outside it the planner by its claims and the
        others by their records."""
        member = self._by_peer.get(peer)
        if member is not None and member.record.role not in MEMBER_ROLES:
            silence_s = NON_MEMBER_DEAD_AFTER_S
        elif in_audience:
            silence_s = DEAD_AFTER_S if planner else self.telemetry_silence_s
        else:
            silence_s = (
                PLANNER_DEAD_AFTER_S if planner else RECORD_DEAD_AFTER_S * record_pace(len(self))
            )
        quiet_s = self.dead_after_s(now) + silence_s - DEAD_AFTER_S
        return member is not None and now - member.last_heard <= quiet_s

    def heard_from(self, peer: str, at: float) -> None:
        """Proof that `peer` lived at `at` (a signed message, a probe's answer)."""
        member = self._by_peer.get(peer)
        if member is not None:
            member.last_heard = max(member.last_heard, at)

    def is_healthy(self, peer: str) -> bool:
        """Does the member say its worker makes progress? (control/health.py)"""
        member = self._by_peer.get(peer)
        return member is not None and (member.health is None or member.health.ok)

    def speaks_ours(self, peer: str) -> bool:
        """Is the member of our protocol level, or of none (a peer of before the field), or not a
        member (ourselves)? Nodes of two levels would train one plan differently (records/peer.py
        PROTOCOL_LEVEL)."""
        member = self._by_peer.get(peer)
        return member is None or _same_level(member.record)

    def role_of(self, peer: str) -> str | None:
        member = self._by_peer.get(peer)
        return None if member is None else member.record.role

    def forget_dead(self, now: float) -> list[str]:
        """Forget the members silent for FORGET_DEAD_AFTER_S (times record_pace); returns them."""
        after_s = FORGET_DEAD_AFTER_S * record_pace(len(self))
        dead = [p for p, m in self._by_peer.items() if now - m.last_heard > after_s]
        for peer in dead:
            del self[peer]
        return dead

    def keep_only(self, admitted: Callable[[str, PeerRecord], bool]) -> None:
        """Remove the members whose records `admitted` refuses (a run's admission rule)."""
        for peer in [p for p, m in self._by_peer.items() if not admitted(p, m.record)]:
            del self[peer]
