"""Who may do what, from the organiser's key: the run spec it signed, tokens (admission,
planning) and revocations. The view's `authority` part: it owns these and answers for them; what
a peer's record says about its role comes from the view (control/membership.py)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from p2ptrain.errors import WireError
from p2ptrain.records import (
    MEMBER_ROLES,
    PeerRecord,
    Revocation,
    RunSpec,
    Token,
    revocation_problem,
    token_problem,
)

log = logging.getLogger(__name__)


@dataclass
class Authority:
    """The organiser's word as one peer holds it, and the token rules over it."""

    self_id: str
    planner_capable: bool  # our role may plan: it still takes a planner token (own_token)
    bootstrap_id: str | None = None  # the organiser: its key signs the run spec and the tokens
    run: RunSpec | None = None
    own_token: Token | None = None
    revocations: dict[str, Revocation] = field(default_factory=dict)  # peer -> the organiser's
    # (token, peer, organiser) -> whether the token verified: one Ed25519 check per token. The
    # whole token is the key, not its signature: a signature checked once must not vouch for
    # the same `sig` beside another planner flag, expiry or run id
    _verified_tokens: dict[tuple[Token, str, str | None], bool] = field(default_factory=dict)

    def may_plan(self, peer: str, record: PeerRecord | None) -> bool:
        """Only holders of a planner token signed by the organiser may claim or plan: a peer's
        own say (its role, its term) is no authority. `record`: the peer's, as we know it (None:
        unknown); for ourselves, our own token counts."""
        if peer == self.self_id:
            token = self.own_token if self.planner_capable else None
        else:
            placed = record is not None and record.role in MEMBER_ROLES
            token = record.token if record is not None and placed else None
        return token is not None and token.planner and self._token_ok(token, peer)

    def admits(self, peer: str, record: PeerRecord) -> bool:
        """May a peer with this record be a member of our run (its admission rule)?"""
        if self.run is None or self.run.swarm.admission == "open" or peer == self.bootstrap_id:
            return True
        return record.token is not None and self._token_ok(record.token, peer)

    def admits_record_token(self, peer: str, token: object) -> bool:
        """Would a peer record of `peer` carrying `token` (its raw JSON value) be admitted? What
        gossip checks before it parses the record's body."""
        if self.run is None or self.run.swarm.admission == "open" or peer == self.bootstrap_id:
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
        key = (token, peer, self.bootstrap_id)
        if key not in self._verified_tokens:  # an Ed25519 check per token, not per message
            problem = token_problem(token, self.bootstrap_id, peer, now=0.0)
            self._verified_tokens[key] = problem is None
        return self._verified_tokens[key] and token.expires_at >= time.time()

    def revoke(self, entries: tuple[Revocation, ...]) -> str | None:
        """Apply the organiser's revocations: the peers' tokens stop counting at once.
        Revocations are never undone; a list that drops an entry changes nothing. Returns why it
        refused the list (an entry the organiser did not sign: then none applies), or None."""
        new = [r for r in entries if r.peer not in self.revocations]
        for revocation in new:
            if (problem := revocation_problem(revocation, self.bootstrap_id)) is not None:
                return f"revocation of {revocation.peer}: {problem}"
        for revocation in new:
            log.info("the organiser revoked %s", revocation.peer)
            self.revocations[revocation.peer] = revocation
        return None

    def forget_tokens(self, known: set[str]) -> None:
        """Drop the verified-token cache of peers not in `known` (throwaway identities)."""
        for key in [k for k in self._verified_tokens if k[1] not in known]:
            del self._verified_tokens[key]
