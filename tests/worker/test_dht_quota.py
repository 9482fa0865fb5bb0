"""What each plan peer may keep in a worker's DHT storage (worker/dht_quota.py): a member that
stored fresh keys as fast as it could send held that rate x 20 min of the DHT process's
memory; now its unexpired records are bounded in number and bytes, noted as hivemind keeps
them: a re-store replaces a record only with a later expiry, a dictionary's items count one by
one, and storage and cache apart."""

from __future__ import annotations

import pytest

from p2ptrain.worker import dht_quota
from p2ptrain.worker.dht_quota import MAX_BYTES_PER_PEER, MAX_ENTRIES_PER_PEER, StoreQuota

HOUR = 3600.0


def one(key: str, size: int = 100, expiry: float = HOUR, cache: bool = False) -> list:
    return [(key.encode(), b"", cache, size, expiry)]


def test_a_peer_storing_fresh_keys_is_held_to_its_number_of_records() -> None:
    quota = StoreQuota()
    assert all(quota.admit("flooder", one(f"key-{i}"), now=0.0) for i in range(256))
    assert MAX_ENTRIES_PER_PEER == 256
    assert not quota.admit("flooder", one("one-more"), now=1.0)
    # its re-store of a record it holds replaces it; another member is not held back by it
    assert quota.admit("flooder", one("key-0", expiry=2 * HOUR), now=2.0)
    assert quota.admit("honest", one("key-0"), now=3.0)


def test_a_peer_is_held_to_its_bytes_and_everyone_to_the_total(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quota = StoreQuota()
    big = MAX_BYTES_PER_PEER // 4
    assert all(quota.admit("a", one(f"key-{i}", big), now=0.0) for i in range(4))
    assert not quota.admit("a", one("more", 1), now=0.0)
    # a larger re-store of one it holds, expiring later, counts the difference only
    assert quota.admit("a", one("key-0", big, expiry=2 * HOUR), now=0.0)
    monkeypatch.setattr(dht_quota, "MAX_BYTES", MAX_BYTES_PER_PEER + 10)
    assert not quota.admit("b", one("x", 11), now=0.0)  # past the total
    assert quota.admit("b", one("x", 10), now=0.0)


def test_a_re_store_expiring_sooner_changes_nothing_as_in_hivemind() -> None:
    """hivemind keeps the later expiry: 2 MiB records re-stored as 1-byte values expiring in
    0.5 s stayed in its storage while the quota counted them gone."""
    quota = StoreQuota()
    big = MAX_BYTES_PER_PEER // 4
    for i in range(4):
        assert quota.admit("a", one(f"k{i}", big), now=0.0)
        assert quota.admit("a", one(f"k{i}", 1, expiry=0.5), now=0.0)  # kept as it was
    assert not quota.admit("a", one("more", big), now=2.0)  # still 4 x big counted


def test_storage_and_cache_are_counted_apart() -> None:
    """An honest getter caches every member's announcement at each look: that must never
    crowd out its own announcement; nor may a tiny cache store erase a large stored record."""
    quota = StoreQuota()
    assert all(quota.admit("a", one(f"c{i}", cache=True), now=0.0) for i in range(256))
    assert not quota.admit("a", one("c-more", cache=True), now=0.0)
    assert quota.admit("a", one("announcement"), now=0.0)  # its storage slot is its own
    big = MAX_BYTES_PER_PEER
    assert quota.admit("b", one("k", big), now=0.0)
    assert quota.admit("b", one("k", 1, expiry=2 * HOUR, cache=True), now=0.0)
    assert not quota.admit("b", one("other", 1), now=0.0)  # the stored one still counts


def test_a_dictionarys_items_count_one_by_one_under_their_own_expiries() -> None:
    quota = StoreQuota()
    items = [(b"k", f"sub-{i}".encode(), False, 10, HOUR) for i in range(MAX_ENTRIES_PER_PEER)]
    assert quota.admit("a", items, now=0.0)
    assert not quota.admit("a", [(b"k", b"sub-new", False, 10, HOUR)], now=0.0)
    # all of one stored item fit, or none of it is noted
    fresh = [(b"j", f"s{i}".encode(), True, 10, HOUR) for i in range(MAX_ENTRIES_PER_PEER + 1)]
    assert not quota.admit("b", fresh, now=0.0)
    assert quota.admit("b", fresh[:MAX_ENTRIES_PER_PEER], now=0.0)


def test_expired_records_stop_counting() -> None:
    quota = StoreQuota()
    assert all(quota.admit("a", one(f"k{i}", expiry=60.0), now=0.0) for i in range(256))
    assert not quota.admit("a", one("late"), now=30.0)
    assert quota.admit("a", one("late"), now=61.0)
    assert quota.admit("a", one("gone", expiry=50.0), now=61.0)  # expired: nothing is kept
