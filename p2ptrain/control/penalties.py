"""What each peer's bad input has cost it: a score per peer that decays, and a block past a
threshold. Pure logic with the clock passed in, like the view that owns it."""

from __future__ import annotations

from dataclasses import dataclass, field

PENALTY_BLOCK_SCORE = 10.0
PENALTY_HALF_LIFE_S = 30.0
BLOCK_S = 60.0
FORGET_BELOW_SCORE = 0.1  # a score decayed this far is forgotten (identities are free)

# how much each kind of bad input costs its sender (blocked at PENALTY_BLOCK_SCORE)
PENALTIES = {
    "malformed": 5.0,
    "oversized": 5.0,
    "unsigned": 5.0,
    "forged": 10.0,
    "replayed": 2.0,
    "non-planner": 5.0,
    "unauthorised": 5.0,
    # one gossip message past its author's rate for its kind (control/flood.py): honest peers
    # stay 4x below the rates, so ten excess messages within a half-life block a flooder
    "flooding": 1.0,
}


@dataclass
class _Penalty:
    score: float = 0.0
    at: float = 0.0
    blocked_until: float = 0.0

    def decayed(self, now: float) -> float:
        return self.score * 0.5 ** ((now - self.at) / PENALTY_HALF_LIFE_S)


@dataclass
class Penalties:
    """The score table. Entries of peers that stopped misbehaving are pruned, so a flood of
    throwaway identities leaves nothing behind once it stops."""

    _table: dict[str, _Penalty] = field(default_factory=dict)

    def is_blocked(self, peer: str, now: float) -> bool:
        penalty = self._table.get(peer)
        return penalty is not None and now < penalty.blocked_until

    def penalise(self, peer: str, category: str, now: float) -> float:
        """Add the category's cost to peer's score (which decays); block it past the threshold."""
        penalty = self._table.setdefault(peer, _Penalty(at=now))
        penalty.score = penalty.decayed(now) + PENALTIES.get(category, 1.0)
        penalty.at = now
        if penalty.score >= PENALTY_BLOCK_SCORE:
            penalty.blocked_until = now + BLOCK_S
        return penalty.score

    def score(self, peer: str) -> float:
        penalty = self._table.get(peer)
        return 0.0 if penalty is None else penalty.score

    def prune(self, now: float) -> None:
        """Forget the peers that are not blocked and whose score has decayed away."""
        for peer in [
            p
            for p, penalty in self._table.items()
            if now >= penalty.blocked_until and penalty.decayed(now) < FORGET_BELOW_SCORE
        ]:
            del self._table[peer]

    def __len__(self) -> int:
        return len(self._table)
