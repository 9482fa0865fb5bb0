"""The worker's hivemind DHT for one plan: the names its averaging swarms use, seeding its
routing table with the plan's peers, and the validator of start-step announcements."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.serializer import MSGPackSerializer

from p2ptrain.worker.resume.announcement import SUBKEY_PREFIX, check_announcement


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


class AnnouncementValidator(RecordValidatorBase):
    """Runs in every worker's DHT, on every record it is asked to store and every record it
    reads: a record under a resume announcement's subkey (`resume:` + peer id) is kept only if
    it is that peer's signed announcement for that very key (worker/resume/start_step.py), so no one can
    store one under another peer's id, and honest DHT nodes do not keep forged ones. Other
    records (averaging matchmaking) pass as before."""

    def validate(self, record: DHTRecord) -> bool:
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
