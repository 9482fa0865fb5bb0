"""The latest envelope we accepted of each author and kind, kept for sync clients
(NodeState.latest), with a digest of what they say, in buckets by author.

A sync client sends its buckets' digests and is served only the envelopes of the buckets whose
digests differ, a large bucket's as a list of its entries' fingerprints, from which the client
asks for the envelopes it lacks by name (control/sync.py): two nodes that agree move a request and their own messages,
whatever the swarm's size, where pulling every held envelope was O(N) bytes every few seconds
(1,000 peers' records: ~650 kB a sync).

An entry's fingerprint covers its author, kind and body, not its seq or signing time: a record
re-signed unchanged (control/publishing.py re-states each every UNCHANGED_RECORD_S) does not make
two nodes' digests differ. Telemetry is left out of the digests: it changes every few seconds,
and telemetry's audience, which alone is served it, is served all of it. The two ends of a sync
leave out each other's own messages (not the organiser's revocation pages, which its node keeps
here too): the responder sends its own fresh anyway, and neither holds its own here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence

from p2ptrain.records.replies import DIGEST_HEX_CHARS

NUM_BUCKETS = 32  # 64 bits each (DIGEST_HEX_CHARS): ~600 bytes of request
# a differing bucket of more entries is listed by fingerprint (~90 bytes an entry), not sent
# whole (a record is ~650 bytes): at 1,000 peers a bucket is ~31 records
SMALL_BUCKET = 4
LIST_BUCKETS_UP_TO = NUM_BUCKETS // 4  # more differ (a newcomer): send them all at once

Key = tuple[str, str]  # (author, kind); a revocation page's author is "organiser/page"


def fingerprint(key: Key, data: bytes) -> int:
    """64 bits of the entry's author, kind and body (not its seq or time); the bytes' own hash
    if they are not an envelope's JSON (they always are: intake keeps verified ones only)."""
    try:
        body = json.loads(data)["body"]
        said = json.dumps([key[0], key[1], body], sort_keys=True, separators=(",", ":"))
        text = said.encode()
    except (ValueError, KeyError, TypeError):
        text = data
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def bucket_of(author: str) -> int:
    return hashlib.blake2b(author.encode(), digest_size=2).digest()[0] % NUM_BUCKETS


def digested(key: Key, leave_out: tuple[str, ...]) -> bool:
    """Does `key` count in a digest between the two ends `leave_out` (asker, responder)?"""
    author, kind = key
    return kind != "telemetry" and (kind == "revoked" or author not in leave_out)


class HeldEnvelopes(Mapping[Key, bytes]):
    """(author, kind) -> the envelope's bytes, and each entry's fingerprint."""

    def __init__(self) -> None:
        self._data: dict[Key, bytes] = {}
        self._fingerprints: dict[Key, tuple[int, int]] = {}  # key -> (bucket, fingerprint)
        self._kinds: dict[str, set[str]] = {}  # author -> the kinds held of it

    def __getitem__(self, key: Key) -> bytes:
        return self._data[key]

    def __setitem__(self, key: Key, data: bytes) -> None:
        self._data[key] = data
        self._kinds.setdefault(key[0], set()).add(key[1])
        if key[1] != "telemetry":
            self._fingerprints[key] = (bucket_of(key[0]), fingerprint(key, data))

    def __iter__(self) -> Iterator[Key]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def forget_author(self, author: str) -> None:
        """Drop every entry of `author` (no longer a member): kept, a dead or throwaway
        identity's envelopes would be served on every sync for good, and resent for good once
        the clients drop them as stale (their digests would never agree again)."""
        for kind in self._kinds.pop(author, set()):
            del self._data[(author, kind)]
            self._fingerprints.pop((author, kind), None)

    def _bucket_sums(self, leave_out: tuple[str, ...]) -> list[int]:
        sums = [0] * NUM_BUCKETS
        for key, (bucket, value) in self._fingerprints.items():
            if digested(key, leave_out):
                sums[bucket] ^= value
        return sums

    def digests(self, leave_out: tuple[str, ...]) -> tuple[str, ...]:
        """Each bucket's digest (hex), over the entries `digested` between `leave_out`."""
        return tuple(f"{s:0{DIGEST_HEX_CHARS}x}" for s in self._bucket_sums(leave_out))

    def fingerprint(self, author: str, kind: str) -> str | None:
        """The entry's fingerprint (hex), None if we hold none (or telemetry)."""
        held = self._fingerprints.get((author, kind))
        return None if held is None else f"{held[1]:0{DIGEST_HEX_CHARS}x}"

    def differing(
        self, theirs: Sequence[str], leave_out: tuple[str, ...]
    ) -> tuple[list[Key], list[tuple[str, str, str]]]:
        """What to serve of the buckets whose digests differ from `theirs`: the keys to send,
        and the (author, kind, fingerprint) of each entry of a bucket of more than
        SMALL_BUCKET entries, where few buckets differ (the asker names what it lacks). Where
        many differ (a newcomer's empty digests) all their entries are sent."""
        ours = self.digests(leave_out)
        buckets: dict[int, list[Key]] = {b: [] for b in range(NUM_BUCKETS) if ours[b] != theirs[b]}
        for key, (bucket, _) in self._fingerprints.items():
            if bucket in buckets and digested(key, leave_out):
                buckets[bucket].append(key)
        if len(buckets) > LIST_BUCKETS_UP_TO:
            return [key for keys in buckets.values() for key in keys], []
        sent: list[Key] = []
        listed: list[tuple[str, str, str]] = []
        for keys in buckets.values():
            if len(keys) <= SMALL_BUCKET:
                sent += keys
            else:
                listed += [
                    (a, k, f"{self._fingerprints[(a, k)][1]:0{DIGEST_HEX_CHARS}x}") for a, k in keys
                ]
        return sent, listed
