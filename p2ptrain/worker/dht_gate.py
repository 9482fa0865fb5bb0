"""The worker's hivemind DHT serves, and keeps in its routing table, the plan's peers only.

A worker's DHT carries one plan's business: its members' resume announcements
(worker/resume/start_step.py) and averaging matchmaking. hivemind answers anyone who reaches the
worker's p2pd, adds any caller to its routing table under the node id the caller chose, and
stores a key on the nodes nearest to it. So a stranger running 5 DHT nodes with ids next to a
plan's announcement key (`p2ptrain_<run>_resume_t<term>_e<epoch>`, predictable) became the nodes
every member stored its announcement on: they answered "stored", kept nothing, every `get`
found nothing, and no plan could start (every member waited 120 s, then gave up).

p2pd's own services are off for the same reason (`start_gated_dht`): its Kademlia as a server
(ADD_PROVIDER for any key from anyone, kept 48 h) and AutoNAT (dials back on a caller's
request); hivemind's DHT runs its own protocol over p2pd streams and needs neither.

`install` stands a gate in front of the DHT's three handlers: a caller outside the plan's peers
gets an empty refusal (nothing stored, nothing found, no routing entry) and is never added to
the routing table, whichever way we met it; `admit` sets the plan's peers at each session's
start and drops any other peer from the table. Both run inside hivemind's DHT process. A
member's records are bounded in number and bytes (worker/dht_quota.py): past that a store is
refused record by record.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from hivemind.proto import dht_pb2
from hivemind.utils.timed_storage import get_dht_time

from p2ptrain.worker.dht_quota import MAX_BYTES, Record, StoreQuota

_GATE = "_p2ptrain_plan_peers_only"  # the gate's attribute on the DHT's protocol


class PlanPeersOnly:
    """The handlers hivemind registers for a DHTProtocol, each passing the plan's peers on."""

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol
        self.members: frozenset[str] = frozenset()  # none before the first plan
        self.num_refused = 0
        self.quota = StoreQuota()  # the members' records: bounded in number and bytes
        self.num_over_quota = 0

    def admits(self, peer_id: Any) -> bool:
        return bool(peer_id is not None and peer_id.to_base58() in self.members)

    async def rpc_ping(self, request: Any, context: Any) -> Any:
        if not self.admits(context.remote_id):
            self.num_refused += 1
            return dht_pb2.PingResponse(dht_time=get_dht_time(), available=False)
        return await self._protocol.rpc_ping(request, context)

    async def rpc_store(self, request: Any, context: Any) -> Any:
        fields = ("keys", "subkeys", "values", "expiration_time", "in_cache")
        lengths = {len(getattr(request, name)) for name in fields}
        if not self.admits(context.remote_id) or len(lengths) != 1:  # (hivemind asserts them)
            self.num_refused += 1
            return dht_pb2.StoreResponse(store_ok=[False] * len(request.keys))
        peer, now = context.remote_id.to_base58(), get_dht_time()
        items = zip(
            request.keys,
            request.subkeys,
            request.values,
            request.expiration_time,
            request.in_cache,
            strict=True,
        )
        fits = [self.quota.admit(peer, self._records(*item), now) for item in items]
        if all(fits):
            return await self._protocol.rpc_store(request, context)
        self.num_over_quota += fits.count(False)
        kept = dht_pb2.StoreRequest()  # the records within the quota only
        if request.HasField("peer"):
            kept.peer.CopyFrom(request.peer)
        for name in fields:
            getattr(kept, name).extend(
                v for v, ok in zip(getattr(request, name), fits, strict=True) if ok
            )
        stored = iter((await self._protocol.rpc_store(kept, context)).store_ok)
        return dht_pb2.StoreResponse(
            store_ok=[ok and next(stored, False) for ok in fits], peer=self._protocol.node_info
        )

    def _records(
        self, key: bytes, subkey: bytes, value: bytes, expiry: float, in_cache: bool
    ) -> list[Record]:
        """One stored item as hivemind keeps it (worker/dht_quota.py): a value, or each item of
        a whole dictionary (stored under the items' own expiries, the item's is ignored);
        bytes that are no dictionary make a record that never fits (hivemind refuses them)."""
        if subkey != self._protocol.IS_DICTIONARY:
            return [(key, subkey, in_cache, len(value), expiry)]
        try:
            dictionary = self._protocol.serializer.loads(value)
            return [
                (
                    key,
                    self._protocol.serializer.dumps(sub),
                    in_cache,
                    len(item.value),
                    item.expiration_time,
                )
                for sub, item in dictionary.items()
            ]
        except Exception:  # whatever the bytes decode to, if they decode at all
            return [(key, subkey, in_cache, MAX_BYTES + 1, float("inf"))]

    async def rpc_find(self, request: Any, context: Any) -> Any:
        if not self.admits(context.remote_id):
            self.num_refused += 1
            return dht_pb2.FindResponse()
        return await self._protocol.rpc_find(request, context)


async def install(_dht: Any, node: Any) -> None:
    """Put the gate in front of `node`'s DHT handlers and its routing table (run once, in the
    DHT process, before any plan)."""
    protocol = node.protocol
    gate = PlanPeersOnly(protocol)
    await protocol.remove_p2p_handlers(protocol.p2p)
    await protocol.add_p2p_handlers(protocol.p2p, gate)
    update = protocol.update_routing_table

    async def update_members_only(node_id: Any, peer_id: Any, responded: bool = True) -> None:
        if gate.admits(peer_id):  # a non-member that answered a lookup is not kept either
            await update(node_id, peer_id, responded)

    protocol.update_routing_table = update_members_only
    setattr(protocol, _GATE, gate)


async def admit(members: frozenset[str], _dht: Any, node: Any) -> int:
    """The plan's peers are served from now on; every other peer leaves the routing table.
    How many requests of non-members were refused so far."""
    gate: PlanPeersOnly = getattr(node.protocol, _GATE)
    gate.members = members
    table = node.protocol.routing_table
    for node_id, peer_id in list(table.uid_to_peer_id.items()):
        if not gate.admits(peer_id):
            del table[node_id]
    return gate.num_refused


def start_gated_dht(
    listen_maddr: str, announce: list[str], identity_path: str, validators: list[Any]
) -> Any:
    """A started hivemind.DHT on `listen_maddr` (returns once p2pd is up: it has read the key at
    `identity_path`), serving nobody until `admit_plan_peers`."""
    import hivemind

    dht = hivemind.DHT(
        start=True,
        host_maddrs=[listen_maddr],
        announce_maddrs=announce or None,
        nat_port_map=False,
        dht_mode="client",
        auto_nat=False,
        identity_path=identity_path,
        record_validators=validators,
    )
    serve_plan_peers_only(dht)
    return dht


def serve_plan_peers_only(dht: Any) -> None:
    """Gate `dht` (a started hivemind.DHT): nobody is served until `admit_plan_peers`."""
    dht.run_coroutine(install)


def admit_plan_peers(dht: Any, peers: set[str]) -> int:
    """A session's plan: its peers (spares too) are served; the refusals so far."""
    refused: int = dht.run_coroutine(partial(admit, frozenset(peers)))
    return refused
