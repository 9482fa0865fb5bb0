"""The worker's hivemind DHT for one plan: the names its averaging swarms use, seeding its
routing table with the plan's peers, and the validator of every record it stores or reads.

Anyone can reach a worker's DHT (its p2pd address is published) and ask it to store records,
which hivemind keeps, in storage without a size limit, until they expire. The validator bounds
what a stranger can park there: records lasting at most MAX_EXPIRATION_S, of at most
MAX_RECORD_BYTES each. hivemind offers no setting for its storage's size (DHTProtocol.create
makes it unbounded; only its cache has one), and its `maxsize` would bound keys, not the
subkeys under one key, and evict the soonest to expire first: our own short-lived records.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from p2ptrain.worker.resume.announcement import SUBKEY_PREFIX, check_announcement
from p2ptrain.worker.resume.start_step import ANNOUNCEMENT_TTL_S

# our longest-lived records are the resume announcements (hivemind's matchmaking and state
# declarations last seconds to a minute); twice that leaves room for the storer's clock to be ahead
MAX_EXPIRATION_S = 2 * ANNOUNCEMENT_TTL_S
# the largest announcement check_announcement accepts (256 stages x 64 steps) is ~1.85 MB
MAX_RECORD_BYTES = 2 * 1024**2


def swarm_prefix(run_id: str, stage: int, epoch: int, term: int = 0) -> str:
    """The DHT prefix of one stage's averaging swarm in one plan (planner term, epoch)."""
    return f"p2ptrain_{re.sub(r'[^A-Za-z0-9_]', '_', run_id)}_s{stage}_t{term}_e{epoch}"


async def ping_peers(peer_ids: list[str], _dht: Any, node: Any) -> None:
    """Run inside hivemind's DHT process: add the plan's peers to the routing table."""
    from hivemind.p2p import PeerID

    for peer_id in peer_ids:
        await node.protocol.call_ping(PeerID.from_base58(peer_id))


def bootstrap_dht(dht: Any, peer_ids: list[str]) -> None:
    dht.run_coroutine(partial(ping_peers, peer_ids))


def within_bounds(record: DHTRecord) -> bool:
    """Whether `record` expires within MAX_EXPIRATION_S from now (NaN does not) and is at most
    MAX_RECORD_BYTES: the bounds on what anyone may park in our DHT's storage."""
    size = len(record.key) + len(record.subkey) + len(record.value)
    return size <= MAX_RECORD_BYTES and record.expiration_time <= get_dht_time() + MAX_EXPIRATION_S


class AnnouncementValidator(RecordValidatorBase):
    """Runs in every worker's DHT, on every record it is asked to store and every record it
    reads: any record must be `within_bounds`; a record under a resume announcement's subkey
    (`resume:` + peer id) is kept only if it is that peer's signed announcement for that very
    key (worker/resume/start_step.py), so no one can store one under another peer's id, and
    honest DHT nodes do not keep forged ones. Other records (averaging matchmaking) pass."""

    def validate(self, record: DHTRecord) -> bool:
        if not within_bounds(record):
            return False
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
        except Exception:  # not ours to judge: hivemind's own records are checked by hivemind
            return True
        if not isinstance(subkey, str) or not subkey.startswith(SUBKEY_PREFIX):
            return True
        try:
            value = MSGPackSerializer.loads(record.value)
        except Exception:  # msgpack raises many kinds on hostile bytes
            return False
        if not isinstance(value, dict) or not isinstance(value.get("key"), str):
            return False
        if DHTID.generate(source=value["key"]).to_bytes() != record.key:
            return False  # a valid announcement replayed under another plan's key
        peer = subkey[len(SUBKEY_PREFIX) :]
        return check_announcement(value, value["key"], peer, None) is not None
