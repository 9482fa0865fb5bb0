"""Signed peer records that py-libp2p's pubsub would build, check and store again on every RPC.

py-libp2p 0.8.1 attaches the sender's signed peer record (an Ed25519-signed envelope of its
addresses) to every pubsub RPC, and the receiver parses it, checks its signature, and replaces
the sender's addresses in the peerstore with the record's (through the dial gate's filter),
twice for an RPC with control messages: about a fifth of a steady-state control process's CPU
(docs/benchmarks.md, "Control-plane CPU per node"). A peer re-sends the same bytes until its
addresses change, so a record byte-identical to the one we consumed from that same peer, which
the peerstore still holds, is taken as already consumed: what the library would do again gives
the same answer and the same addresses. Any other bytes (a new record, a forged one, another
peer's) take the library's full path, and a known record is consumed again every REFRESH_S, so
its addresses' TTL is renewed as before and a peerstore that lost them gets them back.

The sender's side: the library rebuilds our advertised addresses (and parses its own cached
record to compare them) for every RPC it sends; OwnRecord reuses the bytes for OWN_RECORD_S, so
a change of our addresses reaches the records we send that much later.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

from libp2p.abc import IHost
from libp2p.peer.envelope import Envelope
from libp2p.peer.id import ID
from libp2p.pubsub import gossipsub, pubsub
from libp2p.pubsub.pb.rpc_pb2 import RPC

REFRESH_S = 60.0  # the library's TTL for a record's addresses is 2 hours
# at 1 s, a member re-issued (and signed) its record for nearly every message it forwarded (1% of
# its CPU at 32 peers); our addresses seldom change, and our gossiped peer record carries them too
OWN_RECORD_S = 30.0
MAX_KNOWN = 4096  # records remembered per host; past it, the table starts over

Consume = Callable[[RPC, IHost, ID], bool]
Issue = Callable[[IHost], tuple[bytes, bool]]
_ORIGINAL: Consume = pubsub.maybe_consume_signed_record
_ORIGINAL_ISSUE: Issue = pubsub.env_to_send_in_RPC
_BY_HOST: weakref.WeakKeyDictionary[IHost, KnownRecords] = weakref.WeakKeyDictionary()
_OWN: weakref.WeakKeyDictionary[IHost, OwnRecord] = weakref.WeakKeyDictionary()


class KnownRecords:
    """The last record bytes consumed per peer, and when."""

    def __init__(self, consume: Consume = _ORIGINAL, clock: Callable[[], float] = time.monotonic):
        self._consume = consume
        self._clock = clock
        self._known: dict[ID, tuple[bytes, float, Envelope]] = {}  # peer -> (bytes, when, envelope)
        self.skipped = 0  # records found known (tests and profiles read it)

    def consume(self, rpc: RPC, host: IHost, peer_id: ID) -> bool:
        """maybe_consume_signed_record, less the work a known record would repeat."""
        if not rpc.HasField("senderRecord"):
            return True
        data = rpc.senderRecord
        now = self._clock()
        known = self._known.get(peer_id)
        if (
            known is not None
            and known[0] == data
            and now - known[1] < REFRESH_S
            # still the record the peerstore holds, with its addresses
            and host.get_peerstore().get_peer_record(peer_id) is known[2]
        ):
            self.skipped += 1
            return True
        if not self._consume(rpc, host, peer_id):
            self._known.pop(peer_id, None)
            return False
        held = host.get_peerstore().get_peer_record(peer_id)
        if held is not None:  # what the library stored: its record of peer_id, checked
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            self._known[peer_id] = (data, now, held)
        return True


class OwnRecord:
    """Our own signed record's bytes, as the library issues them, reused for OWN_RECORD_S."""

    def __init__(self, issue: Issue = _ORIGINAL_ISSUE, clock: Callable[[], float] = time.monotonic):
        self._issue = issue
        self._clock = clock
        self._held: tuple[bytes, float] | None = None

    def bytes_for(self, host: IHost) -> tuple[bytes, bool]:
        """env_to_send_in_RPC's answer: (the record's bytes, whether it was issued anew)."""
        now = self._clock()
        if self._held is not None and now - self._held[1] < OWN_RECORD_S:
            return self._held[0], False
        data, issued = self._issue(host)
        self._held = (data, now)
        return data, issued


def install(host: IHost, known: KnownRecords | None = None) -> KnownRecords:
    """Route the pubsub's record checks and record building for `host` through a KnownRecords
    and an OwnRecord (other hosts in the process keep the library's own path)."""
    known = known or KnownRecords()
    _BY_HOST[host] = known
    _OWN[host] = OwnRecord()
    for module in (pubsub, gossipsub):
        module.maybe_consume_signed_record = _consume  # type: ignore[attr-defined]
        module.env_to_send_in_RPC = _issue  # type: ignore[attr-defined]
    return known


def of(host: IHost) -> KnownRecords | None:
    """The KnownRecords installed for `host`, if any."""
    return _BY_HOST.get(host)


def _consume(rpc: RPC, host: IHost, peer_id: ID) -> bool:
    known = _BY_HOST.get(host)
    if known is None:
        return _ORIGINAL(rpc, host, peer_id)
    return known.consume(rpc, host, peer_id)


def _issue(host: IHost) -> tuple[bytes, bool]:
    own = _OWN.get(host)
    if own is None:
        return _ORIGINAL_ISSUE(host)
    return own.bytes_for(host)
