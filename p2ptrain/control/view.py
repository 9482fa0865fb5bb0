"""One peer's view of the swarm: members, liveness, links, the elected planner and the plan.

Pure logic, the clock passed in (monotonic s): every rule is unit-testable without a network. The
node feeds it verified envelopes and its own probe results; it says why it drops what it refuses.

Election: who claims when is control/candidacy.py's; the view follows the claims it hears. A
higher term wins in every view; at equal terms the smaller peer id wins. A planner that sees a
winning claim steps down. Plans are accepted only from the recognised planner, while its planner
token counts, with a newer (term, epoch). Terms: control/terms.py; how the view learns the
current term: control/term_learning.py.
"""

from __future__ import annotations

import logging

from p2ptrain.control.authority import Authority
from p2ptrain.control.drop import Drop
from p2ptrain.control.flapping import Flapping
from p2ptrain.control.links import LinkTable
from p2ptrain.control.membership import DEAD_AFTER_S, Member, Membership
from p2ptrain.control.penalties import Penalties
from p2ptrain.control.plan_checks import plan_problem
from p2ptrain.control.replay import SeqGuard
from p2ptrain.control.run_end import RunEnd
from p2ptrain.control.terms import MAX_TERM_STEP, Terms
from p2ptrain.control.wire import Envelope
from p2ptrain.records import (
    MEMBER_ROLES,
    Claim,
    Health,
    PeerMetrics,
    PeerRecord,
    Plan,
    Revocation,
    Revocations,
    RunSpec,
    Token,
)
from p2ptrain.records import Telemetry as TelemetryBody

__all__ = ["DEAD_AFTER_S", "MAX_TERM_STEP", "MEMBER_ROLES", "Member", "SwarmView"]

log = logging.getLogger(__name__)


class SwarmView:
    """Everything one control process believes about the swarm. Its parts own their state:
    `authority` (the organiser's word: run spec, tokens, revocations), `members` (the others and
    their liveness), `links` (measurements and estimates), `seqs` (replays), `penalties`,
    `run_end`; the view itself holds the election and the plan, and answers what needs more
    than one part (ourselves among the members, a token in a member's record, ...)."""

    def __init__(
        self,
        self_id: str,
        role: str,
        planner_capable: bool,  # our role may plan: it still takes a planner token (own_token)
        started_at: float,
        bootstrap_id: str | None = None,  # the organiser: its key signs the run and the tokens
        run: RunSpec | None = None,
        own_token: Token | None = None,
    ) -> None:
        self.self_id, self.role, self.started_at = self_id, role, started_at
        self.hears_telemetry = True  # every member's telemetry, or candidates' (control/gossip.py)
        self.authority = Authority(self_id, planner_capable, bootstrap_id, run, own_token)
        self.links = LinkTable(self_id)  # control/links.py
        self.seqs = SeqGuard()  # control/replay.py
        self.penalties = Penalties()  # control/penalties.py
        self.run_end = RunEnd()  # is the run trained? (control/run_end.py)
        self.members = Membership()  # the others: records, liveness (control/membership.py)
        self.flapping = Flapping(self_id)  # who is back, but not planned yet: control/flapping.py
        self.term = 0  # the planner's term (known_term: with what `terms` knows)
        self.terms = Terms()  # the highest term claimed or learnt, the anchor, claim clocks
        self.planner: str | None = None
        self.planner_sees = 0  # the peers the planner's last claim said it could plan for
        self.plan: Plan | None = None
        self.plan_version = 0  # bumped whenever `plan` changes
        # a planner-token holder's plan of this run was out (we saw one, or the organiser says
        # so): the run is under way, and its min_peers, which gates the first plan only, gates
        # no new planner's (a restarted one holds no plan). Authority, never a member's word
        self.run_planned = False
        self.own_record: PeerRecord | None = None
        self.own_metrics: PeerMetrics | None = None
        self.own_health = Health(True)  # control/health.py
        self._heard = started_at  # when the envelope being accepted proves its author alive

    @property
    def run(self) -> RunSpec | None:
        """The run spec, as the organiser signed it (held by `authority`)."""
        return self.authority.run

    @run.setter
    def run(self, run: RunSpec | None) -> None:
        self.authority.run = run

    @property
    def term_anchored(self) -> bool:
        """Do we know the current term from the organiser (for the organiser: its holders')?"""
        return self.terms.anchored

    @property
    def bootstrap_id(self) -> str | None:
        """The organiser's peer id (held by `authority`)."""
        return self.authority.bootstrap_id

    @bootstrap_id.setter
    def bootstrap_id(self, peer: str | None) -> None:
        self.authority.bootstrap_id = peer

    @property
    def finished(self) -> bool:
        """Is our run trained to its last step? Then nothing is planned for it any more."""
        return self.run_end.is_finished(self.run)

    # ------------------------------------------------------------------ liveness

    def is_alive(self, peer: str, now: float) -> bool:
        if peer == self.self_id:
            return True
        # outside telemetry's audience we hear the planner by its claims, the others by records
        heard = self.members.heard_lately(peer, now, self.hears_telemetry, peer == self.planner)
        return heard and not self.penalties.is_blocked(peer, now)

    def live_members(self, now: float) -> list[str]:
        """Live peers that train (or are planned like trainers), self included, sorted."""
        peers = [p for p, m in self.members.items() if m.record.role in MEMBER_ROLES]
        if self.role in MEMBER_ROLES:
            peers.append(self.self_id)
        return sorted(p for p in set(peers) if self.is_alive(p, now))

    def is_healthy(self, peer: str) -> bool:
        """Does the peer say its worker makes progress? (control/health.py)"""
        return self.own_health.ok if peer == self.self_id else self.members.is_healthy(peer)

    def forget_stale(self, now: float) -> None:
        """Forget long-dead members and those whose token expired, and every per-author table
        entry of authors that are not members (throwaway identities must not grow our memory)."""
        for peer in self.members.forget_dead(now):
            self.links.forget(peer)
        self._drop_unentitled()  # a token is checked as a message comes: expiry, only here
        known = {self.self_id, *self.members}
        self.seqs.forget_authors(known)
        self.terms.forget(known)
        self.authority.forget_tokens(known)
        self.penalties.prune(now)

    # ------------------------------------------------------------------ incoming messages

    def accept(self, env: Envelope, now: float, heard_at: float | None = None) -> Drop | None:
        """Apply a verified envelope; return a Drop if it must be ignored. `heard_at`: the
        (monotonic) time the envelope proves its author alive at, if earlier than `now` (an
        envelope pulled by sync may be old: it must not raise a dead peer)."""
        if env.author == self.self_id:
            return None  # our own message, echoed back by gossip
        if self.penalties.is_blocked(env.author, now):
            return Drop(f"author {env.author} is blocked")
        if (repeat := self.seqs.check(env)) is not None:
            return repeat
        before = self.members[env.author].last_heard if env.author in self.members else None
        self._heard = heard = now if heard_at is None else min(heard_at, now)
        handler = getattr(self, f"_on_{env.kind}")
        drop: Drop | None = handler(env, now)
        # a refused one too: one envelope served again and again is never blamed twice
        self.seqs.note(env, refused=drop is not None and drop.category is not None)
        if drop is None or drop.category is None:
            member = self.members.get(env.author)
            if member is not None:  # any signed message proves the author lived when sent
                member.last_heard = heard if before is None else max(before, heard)
        return drop

    def _on_run(self, env: Envelope, now: float) -> Drop | None:
        if env.author != self.bootstrap_id:
            return Drop("run spec not signed by our bootstrap", "unauthorised")
        assert isinstance(env.body, RunSpec)
        self.run = env.body
        if self.run.swarm.admission == "token":  # the run's rule may arrive after some records
            self.members.keep_only(self.authority.admits)
        return None

    def _on_revoked(self, env: Envelope, now: float) -> Drop | None:
        if env.author != self.bootstrap_id:
            return Drop("revocations not signed by our bootstrap", "unauthorised")
        assert isinstance(env.body, Revocations)
        problem = self.revoke(env.body.entries)
        return None if problem is None else Drop(problem, "forged")

    def _on_peer(self, env: Envelope, now: float) -> Drop | None:
        assert isinstance(env.body, PeerRecord)
        if not self.authority.admits(env.author, env.body):
            if env.author in self.members:  # its token expired: no longer a member
                del self.members[env.author]
                self.links.forget(env.author)
            return Drop(f"{env.author} holds no token for this run")  # ignored, never dialled
        if env.author == self.bootstrap_id:
            self.run_planned |= env.body.planned  # the organiser's word, from its key
        member = self.members.get(env.author)
        if member is None:
            self.members[env.author] = Member(record=env.body, last_heard=now)
        else:
            member.record = env.body
        return None

    def _on_telemetry(self, env: Envelope, now: float) -> Drop | None:
        if env.author not in self.members:
            return Drop("telemetry before the author's peer record")
        if not self.hears_telemetry and not self.may_plan(env.author):
            return Drop("a member's telemetry goes to the planner candidates, not to us")
        assert isinstance(env.body, TelemetryBody)
        self.links.note_telemetry(env.author, env.body, now)
        self.members[env.author].metrics = env.body.metrics
        self.members[env.author].health = env.body.health
        self.run_end.note_metrics(self.run, env.author, env.body.metrics, self.plan)
        return None

    def _term_jump(self, author: str, what: str, term: int, now: float) -> Drop | None:
        """A term past known_term() + MAX_TERM_STEP: Terms.jump (the organiser votes again)."""
        live = self.may_plan(author) and self.is_alive(author, now)
        ours = self.self_id == self.bootstrap_id  # we are the organiser
        return self.terms.jump(f"{what} from {author}", term, self.known_term(), now, ours, live)

    def _on_claim(self, env: Envelope, now: float) -> Drop | None:
        assert isinstance(env.body, Claim)
        term, author = env.body.term, env.author
        if env.author not in self.members:
            return Drop("claim before the author's peer record")
        if not self.may_plan(author):
            return Drop(f"claim from {author}, which holds no planner token", "unauthorised")
        if (jump := self._term_jump(author, "claim", term, now)) is not None:
            return jump
        live = self.is_alive(author, now)
        self.terms.note_claim(author, term, self._heard, live)  # an old one holds up no election
        if not live:
            return Drop(f"claim from {author}, which we believe dead")
        if term < self.known_term():  # the organiser's word too: a newcomer's term is 0
            return Drop(f"stale claim for term {term} < {self.known_term()}")
        if term == self.term:
            incumbent = self.planner
            if (
                incumbent in (None, author)
                or not self.is_alive(incumbent, now)
                or author < incumbent
            ):
                self._set_planner(author, term, env.body.sees)
                return None
            return Drop(f"claim for term {term} loses the tie-break to {incumbent}")
        # A higher term wins in every view, a live incumbent's included: were the incumbent to
        # step down while others kept it, views would split (a rejoining peer that claimed
        # before it heard the incumbent did exactly that). candidacy.should_claim keeps such
        # claims rare.
        self._set_planner(author, term, env.body.sees)
        return None

    def _set_planner(self, planner: str, term: int, sees: int = 0) -> None:
        if (planner, term) != (self.planner, self.term):
            log.info("planner is now %s (term %d)", planner, term)
        self.planner, self.term, self.planner_sees = planner, term, sees
        self.terms.lost_at = None  # a planner stands: the back-off starts when it goes

    def _on_plan(self, env: Envelope, now: float) -> Drop | None:
        plan = env.body
        assert isinstance(plan, Plan)
        key = plan.key
        current = self.plan.key if self.plan else (0, 0)
        if plan.planner != env.author:
            return Drop("plan's planner field differs from its signer", "forged")
        self.run_planned |= self.may_plan(env.author)  # followed or not: a plan was made
        if env.author != self.planner or plan.term < self.term or not self.may_plan(env.author):
            # Blame only a plan for a term we already follow another live planner in, from a
            # peer we never heard claim it (Intake: only if it sent the plan itself). Anything
            # else is an honest difference of views (a claim in flight, a deposed planner).
            hostile = (
                plan.term <= self.term
                and self.planner is not None
                and self.is_alive(self.planner, now)
                and self.terms.claimed.get(env.author, 0) < plan.term
            )
            if hostile:
                return Drop(
                    f"plan {key} from {env.author}, which is not the planner", "non-planner"
                )
            return Drop(f"plan {key} from {env.author}, which we do not follow")
        if key < current:
            return Drop(f"stale plan {key} < {current}")
        if (jump := self._term_jump(env.author, "plan", plan.term, now)) is not None:
            return jump
        own = self.self_id if self.role in MEMBER_ROLES else None  # we may be in the plan
        if key > current and (refused := plan_problem(plan, self.run, self.members, own)):
            return refused
        if key > current:
            self.term = max(self.term, plan.term)
            self.plan = plan
            self.plan_version += 1
            log.info("accepted plan term %d epoch %d from %s", *key, env.author)
        return None

    # ------------------------------------------------------------------ authority and terms

    def may_plan(self, peer: str) -> bool:
        """Does `peer` hold a valid planner token (in the record we have of it)?"""
        member = self.members.get(peer)
        return self.authority.may_plan(peer, None if member is None else member.record)

    def revoke(self, entries: tuple[Revocation, ...]) -> str | None:
        """Apply the organiser's revocations (Authority.revoke): a revoked planner is no longer
        followed, and a revoked member no longer admitted in a token run. Returns why the list
        was refused, or None."""
        problem = self.authority.revoke(entries)
        self._drop_unentitled()
        return problem

    def _drop_unentitled(self) -> None:
        """Remove the members whose token no longer admits them (revoked, expired), and a
        planner whose planner token no longer counts: elect another, refuse its plans."""
        for peer in [p for p, m in self.members.items() if not self.authority.admits(p, m.record)]:
            del self.members[peer]
            self.links.forget(peer)
        if self.planner is not None and not self.may_plan(self.planner):
            self.planner = None

    def known_term(self) -> int:
        """The highest term we accepted a claim or plan of, or learnt from the organiser."""
        return max(self.term, self.terms.max_seen)

    # ------------------------------------------------------------------ election

    def claim(self) -> int:
        """Become planner with a fresh term; returns the term."""
        self._set_planner(self.self_id, max(self.known_term(), self.terms.unfollowed) + 1)
        self.terms.max_seen = self.term
        return self.term

    def adopt_own_plan(self, plan: Plan) -> None:
        """The planner accepts its own newly computed plan."""
        self.plan = plan
        self.plan_version += 1
        self.run_planned = True

    # ------------------------------------------------------------------ measurements

    def record_rtt(self, peer: str, rtt_ms: float, now: float) -> None:
        """A round trip we measured: the link's sample, and proof of life."""
        self.links.record_rtt(peer, rtt_ms, now)
        self.members.heard_from(peer, now)
