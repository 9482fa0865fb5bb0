"""The organiser's current term after its restart, from the planner-token holders' word.

A restarted bootstrap knows no term, and a holder may not claim before the organiser's term is
known (candidacy.py): the organiser asks up to MAX_TERM_ASKS holders at once (sync_partners.py).
It took the first answer, so a hostile holder that answered first set any term the bootstrap
then believed and handed to fresh nodes. It takes the low median of the answers of as many
holders as it asked, or of those that answered within TERM_VOTE_WAIT_S of the first: one liar
among three holders sets nothing; with one or two holders, one can still (docs/security.md).
"""

from __future__ import annotations

MAX_TERM_ASKS = 3  # planner-token holders an unanchored organiser syncs from at once
TERM_VOTE_WAIT_S = 5.0  # after the first answer, for the others asked (a dead holder never answers)


class TermVotes:
    """Holders' answers, one per holder (its latest), until the organiser anchors."""

    def __init__(self) -> None:
        self.votes: dict[str, int] = {}
        self.first_at: float | None = None

    def vote(self, peer: str, term: int, now: float, live_holders: int) -> int | None:
        """Count `peer`'s answer at `now`; the term to anchor on once enough holders answered
        (as many as are asked: MAX_TERM_ASKS, or every live holder if fewer) or the wait is
        over, else None."""
        self.votes[peer] = term
        if self.first_at is None:
            self.first_at = now
        needed = min(MAX_TERM_ASKS, max(1, live_holders))
        if len(self.votes) < needed and now - self.first_at < TERM_VOTE_WAIT_S:
            return None
        terms = sorted(self.votes.values())
        return terms[(len(terms) - 1) // 2]  # the low median: a lone high claim never wins
