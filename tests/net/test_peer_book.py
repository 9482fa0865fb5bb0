"""A full peerstore (net/peer_book.py) forgets strangers: never our own keys, a connected peer or
a member of the run. With py-libp2p's own eviction, 1,000 identities with dialable addresses
evicted our keys first (they have no addresses): identify, publish and DHT puts then failed."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.net import peer_book
from p2ptrain.net.host import full_addrs, make_host
from tests.net.trio_run import run

LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def _identity() -> ID:
    return ID.from_pubkey(create_new_key_pair(os.urandom(32)).public_key)


def _fill(store: Any, count: int, first: int = 0) -> list[ID]:
    """`count` strangers, each with a global address (stored only: nothing is dialled)."""
    peers = []
    for n in range(first, first + count):
        peer = _identity()
        store.add_addrs(peer, [Multiaddr(f"/ip4/1.2.{n // 250}.{n % 250 + 1}/tcp/4001")], 3600)
        peers.append(peer)
    return peers


def test_a_flood_of_identities_cannot_evict_our_own_keys() -> None:
    host = make_host(os.urandom(32))
    store: Any = host.get_peerstore()
    _fill(store, peer_book.MAX_PEERS + 200)
    assert len(store.peer_data_map) <= peer_book.MAX_PEERS
    assert host.get_public_key() is not None
    assert host.get_private_key() is not None


def test_members_stay_and_the_oldest_strangers_go_first() -> None:
    member = _identity()
    host = make_host(os.urandom(32), keeps=lambda peer: peer == member.to_base58())
    store: Any = host.get_peerstore()
    store.add_addrs(member, [Multiaddr("/ip4/1.3.0.1/tcp/4001")], 3600)
    book = peer_book.PeerBook(host, lambda peer: peer == member.to_base58(), max_peers=64)
    store.max_peers, store._enforce_peer_limit = 64, book.enforce
    old = _fill(store, 40)
    for data in (store.peer_data_map[peer] for peer in old):
        data.last_identified -= 600  # identified ten minutes ago
    new = _fill(store, 30, first=40)

    # us, the member and 40 old: the 23rd new stranger made 65, cut to 56 (7/8) by forgetting
    # 9 old ones; 7 more followed
    assert book.num_evicted == 9
    assert len(store.peer_data_map) == 63, len(store.peer_data_map)
    assert store.addrs(member) == [Multiaddr("/ip4/1.3.0.1/tcp/4001")]
    assert host.get_id() in store.peer_data_map
    assert all(peer in store.peer_data_map for peer in new)
    assert sum(peer not in store.peer_data_map for peer in old) == 9


def test_a_connected_peer_stays_through_a_flood() -> None:
    """A real loopback connection: the flood evicts strangers around it, not the peer."""

    async def scenario() -> tuple[bool, bool, int]:
        server, client = make_host(os.urandom(32)), make_host(os.urandom(32))
        async with server.run(listen_addrs=LISTEN), client.run(listen_addrs=LISTEN):
            with trio.fail_after(10):
                await client.connect(info_from_p2p_addr(Multiaddr(full_addrs(server)[0])))
            store: Any = client.get_peerstore()
            book = peer_book.install(client, max_peers=32)
            _fill(store, 100)
            kept = server.get_id() in store.peer_data_map and bool(store.addrs(server.get_id()))
            return kept, client.get_public_key() is not None, book.num_evicted

    kept, has_keys, evicted = run(scenario)
    assert kept and has_keys
    assert evicted > 0


def test_entries_without_addresses_go_before_strangers_with_them() -> None:
    host = make_host(os.urandom(32))
    store: Any = host.get_peerstore()
    book = peer_book.install(host, max_peers=16)
    bare = [_identity() for _ in range(6)]
    for peer in bare:
        store.add_protocols(peer, ["/meshsub/1.1.0"])  # an entry, no address
    dialable = _fill(store, 12)
    # us and 6 bare: the 10th dialable one made 17, cut to 14 by forgetting 3 bare entries
    assert book.num_evicted == 3
    assert all(peer in store.peer_data_map for peer in dialable)
    assert sum(peer not in store.peer_data_map for peer in bare) == 3


def test_the_librarys_own_eviction_loses_our_keys() -> None:
    """What the book is for: without it the same flood leaves the host without its keys."""
    host = make_host(os.urandom(32))
    store: Any = host.get_peerstore()
    library = type(store)._enforce_peer_limit
    store._enforce_peer_limit = lambda: library(store)
    store.max_peers = 100
    _fill(store, 101)
    with pytest.raises(KeyError):
        host.get_public_key()


def test_a_failing_keeps_predicate_keeps_the_peer() -> None:
    def broken(peer: str) -> bool:
        raise RuntimeError("membership is being rebuilt")

    host = make_host(os.urandom(32), keeps=broken)
    store: Any = host.get_peerstore()
    book = peer_book.PeerBook(host, broken, max_peers=8)
    store.max_peers, store._enforce_peer_limit = 8, book.enforce
    peers = _fill(store, 12)
    assert all(peer in store.peer_data_map for peer in peers)
    assert book.num_evicted == 0


def test_what_identify_says_is_kept_bounded() -> None:
    """A stranger's identify of 1 MiB of protocol names kept a ~15 MB entry; repeated pushes
    grew it further (the library extends the list)."""
    host = make_host(os.urandom(32))
    store: Any = host.get_peerstore()
    stranger = _identity()
    flood = [f"/{n % 36}{n}" for n in range(255_000)] + ["/x" * 200]
    store.add_protocols(stranger, flood)
    store.add_protocols(stranger, [*flood[:10], "/meshsub/1.1.0"])
    kept = store.get_protocols(stranger)
    assert len(kept) == peer_book.MAX_PROTOCOLS and len(set(kept)) == len(kept)
    assert all(len(name) <= peer_book.MAX_PROTOCOL_CHARS for name in kept)
    honest = _identity()
    for _ in range(3):  # identify, then two pushes: no duplicates pile up
        store.add_protocols(honest, ["/meshsub/1.1.0", "/ipfs/id/1.0.0"])
    assert store.get_protocols(honest) == ["/meshsub/1.1.0", "/ipfs/id/1.0.0"]
    store.set_protocols(honest, flood)
    assert len(store.get_protocols(honest)) == peer_book.MAX_PROTOCOLS


def test_entries_made_without_addresses_count_against_the_limit() -> None:
    """The library checked its limit in `add_addrs` only: 200 strangers with keys and
    protocols but no dialable address (the dial gate stores none) all stayed."""
    host = make_host(os.urandom(32))
    store: Any = host.get_peerstore()
    book = peer_book.install(host, max_peers=64)
    for _ in range(200):
        pair = create_new_key_pair(os.urandom(32))
        peer = ID.from_pubkey(pair.public_key)
        store.add_pubkey(peer, pair.public_key)
        store.add_protocols(peer, ["/meshsub/1.1.0"])
    assert len(store.peer_data_map) <= 64
    assert book.num_evicted >= 136
    assert host.get_public_key() is not None


class _Envelope:
    def __init__(self, size: int) -> None:
        self.raw_payload = b"\0" * size


def test_an_oversized_signed_peer_record_is_refused_unread() -> None:
    host = make_host(os.urandom(32))
    store: Any = host.get_peerstore()
    assert store.consume_peer_record(_Envelope(peer_book.MAX_PEER_RECORD_BYTES + 1), 7200) is False
    assert not store.peer_record_map
