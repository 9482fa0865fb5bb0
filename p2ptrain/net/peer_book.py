"""What a host's peerstore forgets when it is full: strangers, never ourselves, the peers we are
connected to, or those the run vouches for.

py-libp2p 0.8.1's peerstore holds at most 1,000 peers, and past that `add_addrs` evicts entries
without addresses first, then the oldest. Our own entry (our keys) has no addresses, so it went
first: once 1,000 identities with dialable addresses had reached the peerstore (identify of
inbound connections, or one lookup answered by a hostile DHT server) `host.get_public_key()`
failed, and with it identify, every GossipSub publish and every DHT put. Then the oldest honest
peers went: the bootstrap's and the members' addresses.

`install` replaces that eviction: only peers that are neither us, nor connected, nor kept
(`keeps`: the control plane's members and its bootstrap) may go; entries without addresses,
then expired ones, then the least recently identified go first; and the book is cut to 7/8 of
its size at once, so the sort runs once per an eighth of it, not once per new peer.

And it bounds each entry and every way one is made. The library checks its limit in `add_addrs`
only, and keeps what identify says whole: a stranger with no dialable address (the dial gate
stores none) answering identify with 1 MiB of protocol names left a ~15 MB entry that no limit
counted, per identity, for good. So the limit is checked wherever an entry is created, a peer
keeps at most MAX_PROTOCOLS protocol names of at most MAX_PROTOCOL_CHARS each (ours and an honest
peer's: ~20), and a signed peer record past MAX_PEER_RECORD_BYTES is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from libp2p.abc import IHost
from libp2p.peer.id import ID

from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)

# ≈2.8 KB an entry: 11 MB at most; room for a 1,000-member run, its DHT and its strangers
MAX_PEERS = 4096
MAX_PROTOCOLS = 64  # names a peer may have us keep (ours are ~20)
MAX_PROTOCOL_CHARS = 256
MAX_PEER_RECORD_BYTES = 4096  # a signed peer record's payload: 16 addresses fit many times


def bounded_protocols(protocols: Iterable[object]) -> list[str]:
    """The first MAX_PROTOCOLS distinct names of at most MAX_PROTOCOL_CHARS, in their order."""
    kept: dict[str, None] = {}
    for name in protocols:
        if isinstance(name, str) and len(name) <= MAX_PROTOCOL_CHARS:
            kept[name] = None
            if len(kept) == MAX_PROTOCOLS:
                break
    return list(kept)


class _Entries(dict[Any, Any]):
    """The peerstore's map: the book's limit is checked wherever the library makes an entry
    (it makes them with `setdefault`), not in `add_addrs` only."""

    def __init__(self, book: PeerBook, entries: dict[Any, Any]) -> None:
        super().__init__(entries)
        self.book = book

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        value = super().setdefault(key, default)
        if len(self) > self.book.max_peers:
            self.book.enforce(spare=key)  # the entry being made is written next
        return value


class PeerBook:
    """The eviction policy of one host's peerstore; `keeps(peer_id)` names the peers the run
    vouches for (base58 ids)."""

    def __init__(
        self, host: IHost, keeps: Callable[[str], bool], max_peers: int = MAX_PEERS
    ) -> None:
        self.host = host
        self.keeps = keeps
        self.max_peers = max_peers
        self.num_evicted = 0
        self._spare: ID | None = None
        self._log = SampledLog(log)

    def may_evict(self, peer_id: ID, connected: set[ID]) -> bool:
        if peer_id == self.host.get_id() or peer_id in connected or peer_id == self._spare:
            return False
        try:
            return not self.keeps(peer_id.to_base58())
        except Exception:  # a failing predicate keeps the peer
            return False

    def enforce(self, spare: ID | None = None) -> None:
        """Cut the peerstore to 7/8 of max_peers, strangers first (never `spare`: the entry
        being made); kept peers may stay above."""
        store: Any = self.host.get_peerstore()
        entries = store.peer_data_map
        if len(entries) <= self.max_peers:
            return
        self._spare = spare
        connected = set(self.host.get_network().connections)
        candidates = [
            (bool(data.get_addrs()), not data.is_expired(), data.get_last_identified(), n, peer)
            for n, (peer, data) in enumerate(entries.items())
            if self.may_evict(peer, connected)
        ]
        candidates.sort()
        excess = len(entries) - self.max_peers * 7 // 8
        for *_, peer in candidates[:excess]:
            store.peer_record_map.pop(peer, None)
            del entries[peer]
        self.num_evicted += min(excess, len(candidates))
        self._log.event(
            "evicted",
            "the peerstore was full: forgot %d strangers (%d in all), %d entries left",
            min(excess, len(candidates)),
            self.num_evicted,
            len(entries),
        )


def install(
    host: IHost, keeps: Callable[[str], bool] = lambda _: False, max_peers: int = MAX_PEERS
) -> PeerBook:
    """Give the host's peerstore our eviction policy; the book."""
    book = PeerBook(host, keeps, max_peers)
    store: Any = host.get_peerstore()
    store.max_peers = max_peers
    store._enforce_peer_limit = book.enforce
    store.peer_data_map = _Entries(book, store.peer_data_map)
    set_protocols = store.set_protocols
    consume_peer_record = store.consume_peer_record

    def add_bounded(peer_id: ID, protocols: Sequence[str]) -> None:
        known = store.get_protocols(peer_id) if store.has_peer(peer_id) else []
        set_protocols(peer_id, bounded_protocols([*known, *protocols]))

    def set_bounded(peer_id: ID, protocols: Sequence[str]) -> None:
        set_protocols(peer_id, bounded_protocols(protocols))

    def consume_small(envelope: Any, ttl: int) -> bool:
        if len(getattr(envelope, "raw_payload", b"")) > MAX_PEER_RECORD_BYTES:
            return False
        return bool(consume_peer_record(envelope, ttl))

    store.add_protocols, store.set_protocols = add_bounded, set_bounded
    store.consume_peer_record = consume_small
    return book
