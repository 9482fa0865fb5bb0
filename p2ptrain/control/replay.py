"""Which envelopes of each author and kind a view already applied: a repeat is a duplicate, an
older sequence number is out of order (gossip took another path). Pure; the view's `seqs` part."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from p2ptrain.control.drop import Drop
from p2ptrain.control.wire import Envelope

NUM_RECENT_SEQS = 64  # per author and kind: a repeat of one of these is a replay
# kinds whose messages are pages of one list that only grows (revocations): an older page is
# not stale, it holds other entries
PAGED_KINDS = frozenset({"revoked"})


@dataclass
class SeqGuard:
    """The latest and the recent sequence numbers applied, per (author, kind), and the recent
    ones refused as hostile: a copy of one is a duplicate too, never blamed again, and never
    counts as known (gossip does not forward it, sync counts it of no use)."""

    _last: dict[tuple[str, str], int] = field(default_factory=dict)
    _recent: dict[tuple[str, str], deque[int]] = field(default_factory=dict)
    _refused: dict[tuple[str, str], deque[int]] = field(default_factory=dict)

    def check(self, env: Envelope) -> Drop | None:
        """Why `env` must not be applied again (a harmless Drop), or None."""
        key = (env.author, env.kind)
        if env.seq in self._recent.get(key, ()):
            # Already applied. Not blamed: pull sync and gossip both deliver honest envelopes,
            # so a second copy is normal; a replay attack (another peer re-publishing it as its
            # own gossip) is caught by the node's origin check.
            return Drop(f"duplicate {env.kind} seq {env.seq}")
        if env.seq < self._last.get(key, -1) and env.kind not in PAGED_KINDS:
            return Drop(f"out-of-order {env.kind} seq {env.seq}")  # gossip took another path
        return None

    def note(self, env: Envelope, refused: bool = False) -> None:
        """`env` was applied or dropped (`refused`: as hostile): its seq is now known."""
        key = (env.author, env.kind)
        self._last[key] = env.seq
        self._recent.setdefault(key, deque(maxlen=NUM_RECENT_SEQS)).append(env.seq)
        if refused:
            self._refused.setdefault(key, deque(maxlen=NUM_RECENT_SEQS)).append(env.seq)

    def knows(self, env: Envelope) -> bool:
        """True if this envelope (or a newer one of its author and kind) was already applied."""
        key = (env.author, env.kind)
        if env.seq in self._refused.get(key, ()):
            return False
        if env.kind in PAGED_KINDS:
            return env.seq in self._recent.get(key, ())
        return env.seq <= self._last.get(key, -1)

    def authors(self) -> set[str]:
        return {author for author, _ in self._last} | {author for author, _ in self._recent}

    def forget_authors(self, keep: set[str]) -> None:
        """Drop the entries of every author not in `keep` (throwaway identities)."""
        for table in (self._last, self._recent, self._refused):
            for key in [key for key in table if key[0] not in keep]:
                del table[key]
