"""What one view knows of terms besides the planner it follows (control/view.py holds that): the
highest term claimed or learnt, whether the organiser's word anchors it, and the election's
clocks.

Terms advance by bounded steps: a claim or plan may exceed the highest term we know by at most
MAX_TERM_STEP, so a planner-token holder cannot win every view with a huge term. A node learns
the current term from the organiser (the bootstrap's sync replies: `anchor_term`) before it
claims; until then it drops a too-high term quietly instead of blaming its author.

The organiser anchors its own term by its planner-token holders' low median (term_votes.py),
and every newcomer's by its word: were it to stay behind (cut off while the swarm failed over
three times, or a holder blocked there while it gossiped jumps to everyone else), every node
joining later would follow the wrong planner. So a jump from a live holder is never blamed in
the organiser's view, and makes it ask its holders again, at most once per TERM_REVOTE_EVERY_S.

Election clocks: the live candidate with the smallest peer id claims as soon as no planner
stands; the k-th smallest (k = 0, 1, ...) only once no planner stood for k x dead_after_s: a
live holder that never claims (a ground smallest id, or one that cannot reach the organiser
and is never anchored) held every election up.
"""

from __future__ import annotations

import logging
import math

from p2ptrain.control.drop import Drop
from p2ptrain.control.term_votes import TermVotes

log = logging.getLogger(__name__)

# how far a claimed term may pass the highest we know: honest claims are highest seen + 1, and
# +2 leaves room for two rivals' claims racing past a peer that missed the first
MAX_TERM_STEP = 2
# a holder's jumps unanchor the organiser for one vote (at most TERM_VOTE_WAIT_S) this often
TERM_REVOTE_EVERY_S = 30.0


class Terms:
    """The view's term bookkeeping: bounds, the organiser's anchor and vote, claim clocks."""

    def __init__(self) -> None:
        self.max_seen = 0  # the highest a live holder claimed, we learnt or claimed: known
        self.unfollowed = 0  # the highest a holder we believe dead claimed (heard out)
        self.anchored = False  # we learnt the current term from the organiser (anchor)
        self.claim_seen_at = -math.inf  # the latest a claim (followed or not) proves
        self.claimed: dict[str, int] = {}  # the highest term each peer claimed
        self.lost_at: float | None = None  # since when no planner stood (should_claim)
        self._votes = TermVotes()  # the organiser's own, after a restart: from the holders
        self._revote_at = -math.inf  # the organiser's next vote may start then

    def anchor(self, term: int, known: int, now: float | None) -> None:
        """The organiser's current term; one above `known`, learnt at `now`, counts as a claim
        heard then (a late candidate hears its planner out)."""
        if not self.anchored:
            log.info("the organiser's current term is %d", term)
        if now is not None and term > known:
            self.claim_seen_at = max(self.claim_seen_at, now)
        self.max_seen = max(self.max_seen, term)
        self.anchored = True

    def vote(self, peer: str, said: int, at: float, live_holders: int) -> int | None:
        """A holder's term for the organiser's vote (TermVotes.vote)."""
        return self._votes.vote(peer, said, at, live_holders)

    def jump(
        self, what: str, term: int, known: int, now: float, organiser: bool, live_holder: bool
    ) -> Drop | None:
        """A term past known + MAX_TERM_STEP: blamed once we know the current term, dropped
        quietly before (it may be honest and we the one behind). The organiser, which may be
        the one behind, never blames one, and a live holder's makes it vote again."""
        bound = known + MAX_TERM_STEP
        if term <= bound:
            return None
        if organiser and live_holder and self.anchored and now >= self._revote_at:
            log.warning(
                "%s for term %d passes ours, %d: asking the holders again", what, term, known
            )
            self.anchored, self._votes = False, TermVotes()
            self._revote_at = now + TERM_REVOTE_EVERY_S
        category = "unauthorised" if self.anchored and not organiser else None
        return Drop(f"{what} for term {term} jumps past {bound}", category)

    def note_claim(self, author: str, term: int, heard: float, live: bool) -> None:
        """A holder's claim, followed or not, that proves its author alive at `heard` (a claim
        pulled by sync may be old: a silent holder's relayed claims must not hold an election
        up). One from a holder we believe dead is heard out, but raises no known term: it
        would make the live planner's claims look stale to a newcomer."""
        self.claimed[author] = max(self.claimed.get(author, 0), term)
        if live:
            self.max_seen = max(self.max_seen, term)
        else:
            self.unfollowed = max(self.unfollowed, term)
        self.claim_seen_at = max(self.claim_seen_at, heard)

    def hearing_out(self, term: int, now: float, dead_after_s: float) -> bool:
        """Was a term above `term` (the one we follow) claimed or learnt within dead_after_s?
        Then its planner may be about to reach us: no claim of ours yet."""
        above = max(self.max_seen, self.unfollowed) > term
        return above and now - self.claim_seen_at < dead_after_s

    def turn_came(self, rank: int, now: float, dead_after_s: float) -> bool:
        """No planner stands: is it the turn of the candidate of this rank (0: the smallest
        live candidate's, at once)? The others back off, rank x dead_after_s each."""
        if self.lost_at is None:
            self.lost_at = now
        return now - self.lost_at >= rank * dead_after_s

    def forget(self, known: set[str]) -> None:
        """Forget the claims of authors not in `known` (throwaway identities)."""
        for author in [a for a in self.claimed if a not in known]:
            del self.claimed[author]
