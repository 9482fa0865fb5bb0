"""What each plan peer may keep in a worker's DHT storage (worker/dht_quota.py): a member that
stored fresh keys as fast as it could send held that rate x 20 min of the DHT process's
memory; now its unexpired records are bounded in number and bytes, its re-stores replace, and
expired ones stop counting."""

from __future__ import annotations

import pytest

from p2ptrain.worker import dht_quota
from p2ptrain.worker.dht_quota import MAX_BYTES_PER_PEER, MAX_ENTRIES_PER_PEER, StoreQuota

HOUR = 3600.0


def fresh(n: int, size: int = 100, expiry: float = HOUR) -> list[tuple[bytes, bytes, int, float]]:
    return [(f"key-{i}".encode(), b"", size, expiry) for i in range(n)]


def test_a_peer_storing_fresh_keys_is_held_to_its_number_of_records() -> None:
    quota = StoreQuota()
    assert all(quota.admit("flooder", fresh(MAX_ENTRIES_PER_PEER), now=0.0))
    assert quota.admit("flooder", [(b"one-more", b"", 100, HOUR)], now=1.0) == [False]
    # its re-store of a record it holds replaces it; another member is not held back by it
    assert quota.admit("flooder", [(b"key-0", b"", 100, HOUR)], now=2.0) == [True]
    assert quota.admit("honest", fresh(3), now=3.0) == [True, True, True]


def test_a_peer_is_held_to_its_bytes_and_everyone_to_the_total(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quota = StoreQuota()
    big = MAX_BYTES_PER_PEER // 4
    assert quota.admit("a", fresh(4, big), now=0.0) == [True] * 4
    assert quota.admit("a", [(b"more", b"", 1, HOUR)], now=0.0) == [False]
    # a larger re-store of one it holds counts the difference only
    assert quota.admit("a", [(b"key-0", b"", big, HOUR)], now=0.0) == [True]
    monkeypatch.setattr(dht_quota, "MAX_BYTES", MAX_BYTES_PER_PEER + 10)
    assert quota.admit("b", [(b"x", b"", 11, HOUR)], now=0.0) == [False]  # past the total
    assert quota.admit("b", [(b"x", b"", 10, HOUR)], now=0.0) == [True]


def test_expired_records_stop_counting() -> None:
    quota = StoreQuota()
    assert all(quota.admit("a", fresh(MAX_ENTRIES_PER_PEER, expiry=60.0), now=0.0))
    assert quota.admit("a", [(b"late", b"", 100, HOUR)], now=30.0) == [False]
    assert quota.admit("a", [(b"late", b"", 100, HOUR)], now=61.0) == [True]


def test_subkeys_of_one_key_are_records_of_their_own() -> None:
    quota = StoreQuota()
    items = [(b"k", f"sub-{i}".encode(), 10, HOUR) for i in range(MAX_ENTRIES_PER_PEER + 1)]
    assert quota.admit("a", items, now=0.0) == [True] * MAX_ENTRIES_PER_PEER + [False]
