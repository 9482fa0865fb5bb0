"""How much each plan peer may keep in this worker's DHT storage (worker/dht_gate.py asks).

Only the plan's peers may store here (the gate), each record at most 2 MiB and 20 min
(worker/dht_helpers.py: within_bounds), but hivemind's storage has no bound on their number:
a plan member storing fresh keys as fast as it could send held that rate x 20 min of our DHT
process's memory (docs/security.md, rows 30.7, 37.42). So every record a peer stores is noted
as hivemind keeps it: by key, subkey and slot (its storage or its cache, two places), with its
size and expiry, replaced only by a later expiry (hivemind keeps the later one: a re-store
expiring sooner changes nothing there, so it changes nothing here), each item of a whole
dictionary on its own. A store is refused when its records would take the peer past
MAX_ENTRIES_PER_PEER records or MAX_BYTES_PER_PEER bytes in that slot, or everyone past
MAX_BYTES. Storage and cache are counted apart: an honest getter's caches (every member's
announcement, re-cached at each look) never crowd out its own announcement.

An honest member keeps a few: its start-step announcement of each plan (a few kB, at most
~1.84 MB) and averaging's short-lived matchmaking records.

Pure: no hivemind, so it is unit-tested beside libp2p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_ENTRIES_PER_PEER = 256
MAX_BYTES_PER_PEER = 16 * 1024 * 1024
MAX_BYTES = 256 * 1024 * 1024

# one record as hivemind stores it: key, subkey (b"" for none), in the cache, bytes, expiry
Record = tuple[bytes, bytes, bool, int, float]


@dataclass
class _Slot:
    """One peer's unexpired records in the storage or the cache: (key, subkey) -> (bytes,
    expiry), and their bytes."""

    held: dict[tuple[bytes, bytes], tuple[int, float]] = field(default_factory=dict)
    num_bytes: int = 0


class StoreQuota:
    def __init__(self) -> None:
        self._slots: dict[tuple[str, bool], _Slot] = {}  # (peer, in the cache)
        self._total = 0
        self._swept_at = float("-inf")

    def admit(self, peer: str, records: Sequence[Record], now: float) -> bool:
        """May `peer` store these records (one stored item: a value, or a dictionary's items)?
        If so they are noted."""
        self._forget_expired(now)
        changes: dict[tuple[bool, bytes, bytes], tuple[int, float]] = {}
        for key, subkey, in_cache, size, expiry in records:
            if expiry <= now:
                continue  # hivemind keeps nothing that expired
            slot = self._slots.get((peer, in_cache), _Slot())
            old = changes.get((in_cache, key, subkey)) or slot.held.get((key, subkey))
            if old is None or expiry > old[1]:  # hivemind keeps the later expiry only
                changes[(in_cache, key, subkey)] = (size, expiry)
        grown: dict[bool, tuple[int, int]] = {}  # in the cache -> new records, bytes more
        for (in_cache, key, subkey), (size, _) in changes.items():
            old = self._slots.get((peer, in_cache), _Slot()).held.get((key, subkey))
            records_more, bytes_more = grown.get(in_cache, (0, 0))
            grown[in_cache] = (records_more + (old is None), bytes_more + size - (old or (0,))[0])
        for in_cache, (records_more, bytes_more) in grown.items():
            slot = self._slots.get((peer, in_cache), _Slot())
            if (
                len(slot.held) + records_more > MAX_ENTRIES_PER_PEER
                or slot.num_bytes + bytes_more > MAX_BYTES_PER_PEER
            ):
                return False
        if self._total + sum(more for _, more in grown.values()) > MAX_BYTES:
            return False
        for (in_cache, key, subkey), (size, expiry) in changes.items():
            slot = self._slots.setdefault((peer, in_cache), _Slot())
            before = slot.held.get((key, subkey), (0, 0.0))[0]
            slot.held[(key, subkey)] = (size, expiry)
            slot.num_bytes += size - before
            self._total += size - before
        return True

    def _forget_expired(self, now: float) -> None:
        """Every expired record stops counting (once a second at most: a peer that stores
        nothing more still counts until then)."""
        if now - self._swept_at < 1.0:
            return
        self._swept_at = now
        for name, slot in list(self._slots.items()):
            for record in [r for r, (_, expiry) in slot.held.items() if expiry <= now]:
                size = slot.held.pop(record)[0]
                slot.num_bytes -= size
                self._total -= size
            if not slot.held:
                del self._slots[name]
