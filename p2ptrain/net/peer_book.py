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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from libp2p.abc import IHost
from libp2p.peer.id import ID

from p2ptrain.sampled_log import SampledLog

log = logging.getLogger(__name__)

# ≈2.8 KB an entry: 11 MB at most; room for a 1,000-member run, its DHT and its strangers
MAX_PEERS = 4096


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
        self._log = SampledLog(log)

    def may_evict(self, peer_id: ID, connected: set[ID]) -> bool:
        if peer_id == self.host.get_id() or peer_id in connected:
            return False
        try:
            return not self.keeps(peer_id.to_base58())
        except Exception:  # a failing predicate keeps the peer
            return False

    def enforce(self) -> None:
        """Cut the peerstore to 7/8 of max_peers, strangers first; kept peers may stay above."""
        store: Any = self.host.get_peerstore()
        entries = store.peer_data_map
        if len(entries) <= self.max_peers:
            return
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
    return book
