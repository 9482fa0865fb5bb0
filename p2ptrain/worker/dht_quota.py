"""How much each plan peer may keep in this worker's DHT storage (worker/dht_gate.py asks).

Only the plan's peers may store here (the gate), each record at most 2 MiB and 20 min
(worker/dht_helpers.py: within_bounds), but hivemind's storage has no bound on their number:
a plan member storing fresh keys as fast as it could send held that rate x 20 min of our DHT
process's memory (docs/security.md, rows 30.7, 37.42). So every record a peer stores is noted
by (key, subkey) with its size and expiry: a new one past MAX_ENTRIES_PER_PEER records or
MAX_BYTES_PER_PEER bytes of its unexpired ones, or past MAX_BYTES in all, is refused (the
peer's own re-store of a record it holds replaces it, as the storage does). An honest member
keeps a few: its start-step announcement of each plan (a few kB, at most ~1.84 MB) and
averaging's short-lived matchmaking records.

Pure: no hivemind, so it is unit-tested beside libp2p.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_ENTRIES_PER_PEER = 256
MAX_BYTES_PER_PEER = 16 * 1024 * 1024
MAX_BYTES = 256 * 1024 * 1024

_Record = tuple[bytes, bytes]  # key, subkey (b"" for none)


class StoreQuota:
    """The unexpired records each peer stored here: (key, subkey) -> (bytes, expiry)."""

    def __init__(self) -> None:
        self._held: dict[str, dict[_Record, tuple[int, float]]] = {}
        self._total = 0
        self._swept_at = float("-inf")

    def admit(
        self, peer: str, items: Sequence[tuple[bytes, bytes, int, float]], now: float
    ) -> list[bool]:
        """Which of `peer`'s records (key, subkey, bytes, expiry) may be stored now; the
        admitted ones are noted."""
        held = self._forget_expired(peer, now)
        decisions = []
        for key, subkey, size, expiry in items:
            before = held.get((key, subkey), (0, 0.0))[0]
            entries = len(held) + ((key, subkey) not in held)
            mine = sum(s for s, _ in held.values()) - before + size
            fits = (
                entries <= MAX_ENTRIES_PER_PEER
                and mine <= MAX_BYTES_PER_PEER
                and self._total - before + size <= MAX_BYTES
            )
            if fits and expiry > now:
                held[(key, subkey)] = (size, expiry)
                self._total += size - before
            decisions.append(fits)
        if not held:
            self._held.pop(peer, None)
        return decisions

    def _forget_expired(self, peer: str, now: float) -> dict[_Record, tuple[int, float]]:
        """`peer`'s unexpired records; every peer's expired ones go, once a second at most
        (a peer that stores nothing more still counts against MAX_BYTES until then)."""
        everyone = now - self._swept_at >= 1.0
        if everyone:
            self._swept_at = now
        for other in list(self._held) if everyone else [peer]:
            held = self._held.get(other, {})
            for record in [r for r, (_, expiry) in held.items() if expiry <= now]:
                self._total -= held.pop(record)[0]
            if not held:
                self._held.pop(other, None)
        return self._held.setdefault(peer, {})
