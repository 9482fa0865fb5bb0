"""The worker's hivemind DHT for one plan: the names its averaging swarms use, and seeding its
routing table with the plan's peers."""

from __future__ import annotations

import re
from functools import partial
from typing import Any


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
