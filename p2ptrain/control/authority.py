"""Who may do what, from the organiser's key: tokens (admission, planning), revocations, and
the term learnt from the organiser. A part of SwarmView (which holds the fields named below)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from p2ptrain.errors import WireError
from p2ptrain.records import (
    MEMBER_ROLES,
    Health,
    PeerMetrics,
    PeerRecord,
    Revocation,
    RunSpec,
    Token,
    revocation_problem,
    token_problem,
)

log = logging.getLogger(__name__)


@dataclass
class Member:
    """What we know about one other peer."""

    record: PeerRecord
    last_heard: float
    metrics: PeerMetrics | None = None
    health: Health | None = None  # its worker's, as it reports it (None: taken as ok)


class Authority:
    """Token, revocation and term rules over the view's fields."""

    self_id: str
    planner_capable: bool
    bootstrap_id: str | None
    run: RunSpec | None
    own_token: Token | None
    revocations: dict[str, Revocation]
    members: dict[str, Member]
    planner: str | None
    term: int
    max_seen_term: int
    term_anchored: bool
    _verified_tokens: dict[tuple[str, str, str | None], bool]

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

    def admits_record_token(self, peer: str, token: object) -> bool:
        """Would a peer record of `peer` carrying `token` (its raw JSON value) be admitted? What
        gossip checks before it parses the record's body."""
        if self.run is None or self.run.admission == "open" or peer == self.bootstrap_id:
            return True
        try:
            return token is not None and self._token_ok(Token.decode(token), peer)
        except WireError:
            return False

    def _token_ok(self, token: Token, peer: str) -> bool:
        if peer in self.revocations:
            return False
        if token.run_id and self.run is not None and token.run_id != self.run.run_id:
            return False  # a token of another run of the organiser's
        key = (token.sig, peer, self.bootstrap_id)
        if key not in self._verified_tokens:  # an Ed25519 check per token, not per message
            problem = token_problem(token, self.bootstrap_id, peer, now=0.0)
            self._verified_tokens[key] = problem is None
        return self._verified_tokens[key] and token.expires_at >= time.time()

    def known_term(self) -> int:
        """The highest term we accepted a claim or plan of, or learnt from the organiser."""
        return max(self.term, self.max_seen_term)

    def anchor_term(self, term: int) -> None:
        """The organiser's view of the current term (a sync reply of the bootstrap, which applies
        the same bound): what a fresh node measures claims against before it may claim itself."""
        self.max_seen_term = max(self.max_seen_term, term)
        self.term_anchored = True

    def learn_term(self, peer: str, term: int | None) -> None:
        """A sync reply's term (None: the responder has not anchored yet). A node believes only
        the organiser's; the organiser itself, after a restart, the first planner-token holder it
        syncs from (a fresh swarm's holders know none: then the current term is its own)."""
        if peer == self.bootstrap_id and term is not None:
            self.anchor_term(term)
        elif self.self_id == self.bootstrap_id and not self.term_anchored and self.may_plan(peer):
            self.anchor_term(self.known_term() if term is None else term)

    def revoke(self, entries: tuple[Revocation, ...]) -> str | None:
        """Apply the organiser's revocations: the peers' tokens stop counting at once (a revoked
        planner is no longer followed, and no longer admitted in a token run). Revocations are
        never undone; a list that drops an entry changes nothing. Returns why it refused the list
        (an entry the organiser did not sign), or None."""
        new = [r for r in entries if r.peer not in self.revocations]
        for revocation in new:
            if (problem := revocation_problem(revocation, self.bootstrap_id)) is not None:
                return f"revocation of {revocation.peer}: {problem}"
        for revocation in new:
            log.info("the organiser revoked %s", revocation.peer)
            self.revocations[revocation.peer] = revocation
            if self.planner == revocation.peer:
                self.planner = None  # elect another; its plans are refused from now
            member = self.members.get(revocation.peer)
            if member is not None and not self._admitted(revocation.peer, member.record):
                del self.members[revocation.peer]
        return None
