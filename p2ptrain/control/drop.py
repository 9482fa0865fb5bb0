"""What the view answers for a message it refuses: the reason, and whom it blames for what."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Drop:
    """A refused message: `category` keys PENALTIES (None: harmless, e.g. a stale re-broadcast)."""

    reason: str
    category: str | None = None
