"""One peer's view of the swarm: members, liveness, links, the elected planner and the plan.

Pure logic with the clock passed in (monotonic seconds), so every rule is unit-testable without a
network. The node feeds it verified envelopes (`wire.decode`) and its own probe results; it answers
"drop this, and why" for everything it refuses.

Election: among live planner-capable members, an incumbent planner keeps its term while it lives:
no one claims while a live planner is known, or while a claim it could not follow yet is fresh.
When none is alive, the live candidate with the smallest peer id claims term = highest seen + 1.
A higher term wins in every view; at equal terms the smaller peer id wins. A planner that sees a
winning claim steps down. Plans are accepted only from the recognised planner with a newer (term, epoch).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from p2ptrain.control.links import MAX_LINK_AGE_S, Link, LinkSample, freshest_links
from p2ptrain.control.penalties import Penalties
from p2ptrain.control.wire import Envelope
from p2ptrain.records import (
    MEMBER_ROLES,
    Claim,
    Health,
    LinkReport,
    PeerMetrics,
    PeerRecord,
    Plan,
    RunSpec,
    Token,
    token_problem,
)
from p2ptrain.records import Telemetry as TelemetryBody

log = logging.getLogger(__name__)

DEAD_AFTER_S = 8.0  # members publish every 2 s: four missed rounds => dead
ELECTION_GRACE_S = 5.0  # listen for an incumbent before claiming after start
FORGET_DEAD_AFTER_S = 600.0
NUM_RECENT_SEQS = 64  # per author and kind: a repeat of one of these is a replay


@dataclass
class Member:
    """What we know about one other peer."""

    record: PeerRecord
    last_heard: float
    metrics: PeerMetrics | None = None
    health: Health | None = None  # its worker's, as it reports it (None: taken as ok)


@dataclass
class Drop:
    """A refused message: `category` keys PENALTIES (None: harmless, e.g. a stale re-broadcast)."""

    reason: str
    category: str | None = None


@dataclass
class SwarmView:
    """Everything one control process believes about the swarm."""

    self_id: str
    role: str
    planner_capable: bool  # our role may plan: it still takes a planner token (own_token)
    started_at: float
    bootstrap_id: str | None = None  # the organiser: its key signs the run spec and the tokens
    run: RunSpec | None = None
    own_token: Token | None = None
    members: dict[str, Member] = field(default_factory=dict)
    own_links: dict[str, LinkSample] = field(default_factory=dict)
    rows: dict[str, tuple[dict[str, LinkReport], float]] = field(default_factory=dict)
    term: int = 0
    max_seen_term: int = 0
    planner: str | None = None
    plan: Plan | None = None
    plan_version: int = 0  # bumped whenever `plan` changes
    own_record: PeerRecord | None = None
    own_metrics: PeerMetrics | None = None
    own_health: Health = field(default_factory=lambda: Health(True))  # control/health.py
    _last_seq: dict[tuple[str, str], int] = field(default_factory=dict)
    _recent_seqs: dict[tuple[str, str], deque[int]] = field(default_factory=dict)
    _claimed_terms: dict[str, int] = field(default_factory=dict)  # highest term each peer claimed
    _claim_seen_at: float = float("-inf")  # when the last claim (accepted or not) came in
    penalties: Penalties = field(default_factory=Penalties)
    _verified_tokens: dict[tuple[str, str, str | None], bool] = field(default_factory=dict)

    # ------------------------------------------------------------------ liveness and penalties

    def is_alive(self, peer: str, now: float) -> bool:
        if peer == self.self_id:
            return True
        member = self.members.get(peer)
        return (
            member is not None
            and now - member.last_heard <= DEAD_AFTER_S
            and not self.is_blocked(peer, now)
        )

    def is_blocked(self, peer: str, now: float) -> bool:
        return self.penalties.is_blocked(peer, now)

    def penalise(self, peer: str, category: str, now: float) -> float:
        """Add the category's cost to peer's score; block it past the threshold (penalties.py)."""
        return self.penalties.penalise(peer, category, now)

    def penalty_score(self, peer: str) -> float:
        return self.penalties.score(peer)

    def heard_from(self, peer: str, now: float) -> None:
        """A direct probe answered: proof of life as good as a message."""
        member = self.members.get(peer)
        if member is not None:
            member.last_heard = max(member.last_heard, now)

    def live_members(self, now: float) -> list[str]:
        """Live peers that train (or are planned like trainers), self included, sorted."""
        peers = [p for p, m in self.members.items() if m.record.role in MEMBER_ROLES]
        if self.role in MEMBER_ROLES:
            peers.append(self.self_id)
        return sorted(p for p in set(peers) if self.is_alive(p, now))

    def is_healthy(self, peer: str) -> bool:
        """Does the peer say its worker makes progress? (control/health.py)"""
        if peer == self.self_id:
            return self.own_health.ok
        member = self.members.get(peer)
        return member is not None and (member.health is None or member.health.ok)

    def plannable_members(self, now: float) -> list[str]:
        """Live members whose workers are healthy: the ones a plan may place; an unhealthy one
        is planned around like a dead one until it is healthy again."""
        return [p for p in self.live_members(now) if self.is_healthy(p)]

    def forget_stale(self, now: float) -> None:
        """Forget long-dead members, and every per-author table entry of authors that are not
        members (a flood of throwaway identities must not grow our memory for good)."""
        for peer in [
            p for p, m in self.members.items() if now - m.last_heard > FORGET_DEAD_AFTER_S
        ]:
            del self.members[peer]
            self.rows.pop(peer, None)
            self.own_links.pop(peer, None)
        known = {self.self_id, *self.members}
        for table in (self._last_seq, self._recent_seqs):
            for key in [key for key in table if key[0] not in known]:
                del table[key]
        for author in [a for a in self._claimed_terms if a not in known]:
            del self._claimed_terms[author]
        for token_key in [k for k in self._verified_tokens if k[1] not in known]:
            del self._verified_tokens[token_key]
        self.penalties.prune(now)

    # ------------------------------------------------------------------ incoming messages

    def accept(self, env: Envelope, now: float) -> Drop | None:
        """Apply a verified envelope; return a Drop if it must be ignored."""
        if env.author == self.self_id:
            return None  # our own message, echoed back by gossip
        if self.is_blocked(env.author, now):
            return Drop(f"author {env.author} is blocked")
        key = (env.author, env.kind)
        recent = self._recent_seqs.setdefault(key, deque(maxlen=NUM_RECENT_SEQS))
        if env.seq in recent:
            # Already applied. Not blamed: pull sync and gossip both deliver honest envelopes,
            # so a second copy is normal; a replay attack (another peer re-publishing it as its
            # own gossip) is caught by the node's origin check.
            return Drop(f"duplicate {env.kind} seq {env.seq}")
        if env.seq < self._last_seq.get(key, -1):
            return Drop(f"out-of-order {env.kind} seq {env.seq}")  # gossip took another path
        handler = getattr(self, f"_on_{env.kind}")
        drop: Drop | None = handler(env, now)
        if drop is None or drop.category is None:
            self._last_seq[key] = env.seq
            recent.append(env.seq)
            if env.author in self.members:  # any signed, fresh message proves the author lives
                self.members[env.author].last_heard = now
        return drop

    def knows(self, env: Envelope) -> bool:
        """True if this envelope (or a newer one of its author and kind) was already applied."""
        return env.seq <= self._last_seq.get((env.author, env.kind), -1)

    def _on_run(self, env: Envelope, now: float) -> Drop | None:
        if env.author != self.bootstrap_id:
            return Drop("run spec not signed by our bootstrap", "unauthorised")
        assert isinstance(env.body, RunSpec)
        self.run = env.body
        if self.run.admission == "token":  # the run's rule may arrive after some records
            for peer in [p for p, m in self.members.items() if not self._admitted(p, m.record)]:
                del self.members[peer]
        return None

    def _on_peer(self, env: Envelope, now: float) -> Drop | None:
        assert isinstance(env.body, PeerRecord)
        if not self._admitted(env.author, env.body):
            return Drop(f"{env.author} holds no token for this run")  # ignored, never dialled
        member = self.members.get(env.author)
        if member is None:
            self.members[env.author] = Member(record=env.body, last_heard=now)
        else:
            member.record = env.body
        return None

    def _on_telemetry(self, env: Envelope, now: float) -> Drop | None:
        if env.author not in self.members:
            return Drop("telemetry before the author's peer record")
        assert isinstance(env.body, TelemetryBody)
        self.rows[env.author] = (env.body.links, now)
        self.members[env.author].metrics = env.body.metrics
        self.members[env.author].health = env.body.health
        return None

    def _capable(self, peer: str, now: float) -> bool:
        return self.may_plan(peer) and self.is_alive(peer, now)

    def may_plan(self, peer: str) -> bool:
        """Only holders of a planner token signed by the organiser may claim or plan: a peer's
        own say (its role, its term) is no authority."""
        if peer == self.self_id:
            token = self.own_token if self.planner_capable else None
        else:
            member = self.members.get(peer)
            placed = member is not None and member.record.role in MEMBER_ROLES
            token = member.record.token if member is not None and placed else None
        return token is not None and token.planner and self._token_ok(token, peer)

    def _admitted(self, peer: str, record: PeerRecord) -> bool:
        if self.run is None or self.run.admission == "open" or peer == self.bootstrap_id:
            return True
        return record.token is not None and self._token_ok(record.token, peer)

    def _token_ok(self, token: Token, peer: str) -> bool:
        key = (token.sig, peer, self.bootstrap_id)
        if key not in self._verified_tokens:  # an Ed25519 check per token, not per message
            problem = token_problem(token, self.bootstrap_id, peer, now=0.0)
            self._verified_tokens[key] = problem is None
        return self._verified_tokens[key] and token.expires_at >= time.time()

    def _on_claim(self, env: Envelope, now: float) -> Drop | None:
        assert isinstance(env.body, Claim)
        term, author = env.body.term, env.author
        if env.author not in self.members:
            return Drop("claim before the author's peer record")
        if not self.may_plan(author):
            return Drop(f"claim from {author}, which holds no planner token", "unauthorised")
        self._claimed_terms[author] = max(self._claimed_terms.get(author, 0), term)
        self.max_seen_term = max(self.max_seen_term, term)
        self._claim_seen_at = now
        if not self.is_alive(author, now):
            return Drop(f"claim from {author}, which we believe dead")
        if term < self.term:
            return Drop(f"stale claim for term {term} < {self.term}")
        if term == self.term:
            incumbent = self.planner
            if (
                incumbent in (None, author)
                or not self.is_alive(incumbent, now)
                or author < incumbent
            ):
                self._set_planner(author, term)
                return None
            return Drop(f"claim for term {term} loses the tie-break to {incumbent}")
        # A higher term wins in every view, a live incumbent's included: were the incumbent to
        # step down while others kept it, views would split (a rejoining peer that claimed
        # before it heard the incumbent did exactly that). should_claim() keeps such claims rare.
        self._set_planner(author, term)
        return None

    def _set_planner(self, planner: str, term: int) -> None:
        if (planner, term) != (self.planner, self.term):
            log.info("planner is now %s (term %d)", planner, term)
        self.planner, self.term = planner, term

    def _on_plan(self, env: Envelope, now: float) -> Drop | None:
        plan = env.body
        assert isinstance(plan, Plan)
        key = plan.key
        current = self.plan.key if self.plan else (0, 0)
        if plan.planner != env.author:
            return Drop("plan's planner field differs from its signer", "forged")
        if env.author != self.planner or plan.term < self.term:
            # Blame only a plan for a term we already follow another live planner in, from a
            # peer that never claimed that term. Anything else is an honest difference of
            # views (a claim still in flight, a deposed planner) and is dropped quietly.
            hostile = (
                plan.term <= self.term
                and self.planner is not None
                and self.is_alive(self.planner, now)
                and self._claimed_terms.get(env.author, 0) < plan.term
            )
            if hostile:
                return Drop(
                    f"plan {key} from {env.author}, which is not the planner", "non-planner"
                )
            return Drop(f"plan {key} from {env.author}, which we do not follow")
        if key < current:
            return Drop(f"stale plan {key} < {current}")
        if key > current and (refused := self._plan_problem(plan)) is not None:
            return refused
        if key > current:
            self.term = max(self.term, plan.term)
            self.plan = plan
            self.plan_version += 1
            log.info("accepted plan term %d epoch %d from %s", *key, env.author)
        return None

    def _plan_problem(self, plan: Plan) -> Drop | None:
        """A plan from our planner is checked before any worker sees it: against the run spec
        (a shape the model cannot take is the planner's fault) and the membership (a peer we
        have no record of yet is a difference of views: dropped quietly, the planner re-sends)."""
        if self.run is not None and plan.stages > min(self.run.stages, self.run.n_layer):
            return Drop(
                f"plan of {plan.stages} stages for a run of {self.run.stages} stages and "
                f"{self.run.n_layer} layers",
                "malformed",
            )
        for peer in plan.peers():
            member = self.members.get(peer)
            known = peer == self.self_id and self.role in MEMBER_ROLES
            if not known and (member is None or member.record.role not in MEMBER_ROLES):
                return Drop(f"plan names {peer}, which is not a member we know")
        return None

    # ------------------------------------------------------------------ election

    def should_claim(self, now: float) -> bool:
        """True when this peer must claim the planner role now."""
        if not self.may_plan(self.self_id) or self.planner == self.self_id:
            return False
        if now - self.started_at < ELECTION_GRACE_S:
            return False
        if self.planner is not None and self.is_alive(self.planner, now):
            return False
        if self.max_seen_term > self.term and now - self._claim_seen_at < DEAD_AFTER_S:
            return False  # someone claims a term we could not follow yet: hear it out first
        candidates = [self.self_id] + [p for p in self.members if self._capable(p, now)]
        return min(candidates) == self.self_id

    def claim(self) -> int:
        """Become planner with a fresh term; returns the term."""
        self._set_planner(self.self_id, max(self.term, self.max_seen_term) + 1)
        self.max_seen_term = self.term
        return self.term

    def adopt_own_plan(self, plan: Plan) -> None:
        """The planner accepts its own newly computed plan."""
        self.plan = plan
        self.plan_version += 1

    # ------------------------------------------------------------------ measurements

    def record_rtt(self, peer: str, rtt_ms: float, now: float) -> None:
        sample = self.own_links.setdefault(peer, LinkSample())
        sample.rtt_ms, sample.rtt_at, sample.num_failures = rtt_ms, now, 0
        self.heard_from(peer, now)

    def record_bandwidth(self, peer: str, mbps: float, now: float) -> None:
        sample = self.own_links.setdefault(peer, LinkSample())
        sample.bandwidth_mbps, sample.bandwidth_at = mbps, now

    def record_probe_failure(self, peer: str) -> None:
        self.own_links.setdefault(peer, LinkSample()).num_failures += 1

    def own_row(self, now: float) -> dict[str, LinkReport]:
        """Our measurements as gossiped in telemetry: values with their ages in seconds."""
        row: dict[str, LinkReport] = {}
        for peer, s in self.own_links.items():
            rtt_age = None if s.rtt_at is None else round(now - s.rtt_at, 3)
            bw_age = None if s.bandwidth_at is None else round(now - s.bandwidth_at, 3)
            if (rtt_age is None or rtt_age > MAX_LINK_AGE_S) and (
                bw_age is None or bw_age > MAX_LINK_AGE_S
            ):
                continue
            row[peer] = LinkReport(s.rtt_ms, rtt_age, s.bandwidth_mbps, bw_age)
        return row

    def links(self, now: float) -> dict[tuple[str, str], Link]:
        """The freshest measurement of every unordered pair, from our own and gossiped rows."""
        return freshest_links({**self.rows, self.self_id: (self.own_row(now), now)}, now)
