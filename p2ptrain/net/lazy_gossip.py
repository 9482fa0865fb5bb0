"""py-libp2p 0.8.1's GossipSub with its lazy gossip bounded, and its per-peer state ending with
the peer.

Lazy gossip: each heartbeat, GossipSub sends IHAVE (the ids of the messages of its last
heartbeats) to peers of a topic outside its mesh: py-libp2p picks max(6, a quarter of them), both
hard-wired (the spec's D_lazy and gossip factor). Gossip only repairs what the mesh failed to
deliver, and our sync pulls whatever both missed (control/sync.py). At 32 peers on one machine
IHAVE was 2.2 of a member's ~8 pubsub writes a second, each a frame through yamux and noise. So
fewer: GOSSIP_PEERS_MIN and GOSSIP_FACTOR of the others (3 at 32 peers, 10 at 100, 100 at 1,000).

Lifetimes (the library's tables that outlived the peers, or grew with what a peer named):
- Pubsub reads control messages from any peer with an inbound /meshsub stream, registered
  (`pubsub.peers`) or not, and a GRAFT put such a stranger in the mesh and the scorer. Nothing
  removed it once it left, and it filled the mesh: after 16 of them, 3 of 4 honest peers got
  none of a node's 5 messages. GRAFT and PRUNE from a stranger are now ignored, and each
  heartbeat first drops from mesh, fanout and scorer whoever is no longer a pubsub peer
  (net/safe_pubsub.py forgets one as it dies).
- A PRUNE left a back-off entry for any topic its sender named, with the back-off it chose,
  expired only when that peer and topic were next looked up. PRUNE now counts only for a topic
  of our mesh, and each heartbeat drops expired entries and those of departed peers.
- Each publish appends a time to `recent_message_deliveries`, trimmed only by adaptive gossip,
  which we disable: each heartbeat now empties it (nothing else reads it).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2

GOSSIP_PEERS_MIN = 3
GOSSIP_FACTOR = 0.1


class LazyGossipSub(GossipSub):
    """GossipSub whose IHAVE goes to max(GOSSIP_PEERS_MIN, GOSSIP_FACTOR x the non-mesh peers),
    that takes GRAFT and PRUNE only from its pubsub peers, and whose heartbeat forgets departed
    peers."""

    def _get_adaptive_gossip_peers_count(self, topic: str, total_peers: int) -> int:
        return gossip_peers(total_peers)

    async def handle_graft(self, graft_msg: rpc_pb2.ControlGraft, sender_peer_id: ID) -> None:
        # a stranger is never forgotten: remove_peer runs only for pubsub peers
        if self._is_pubsub_peer(sender_peer_id):
            await super().handle_graft(graft_msg, sender_peer_id)

    async def handle_prune(self, prune_msg: rpc_pb2.ControlPrune, sender_peer_id: ID) -> None:
        # its back-off entry is kept for any topic named, for as long as the sender asks
        if self._is_pubsub_peer(sender_peer_id) and prune_msg.topicID in self.mesh:
            await super().handle_prune(prune_msg, sender_peer_id)

    def mesh_heartbeat(self) -> tuple[defaultdict[ID, list[str]], defaultdict[ID, list[str]]]:
        """The heartbeat's first step: the mesh it maintains is first swept of departed peers,
        so it refills in the same heartbeat."""
        self.forget_departed()
        return super().mesh_heartbeat()

    def forget_departed(self) -> None:
        """Drop per-peer state of peers that are no longer pubsub peers, expired back-offs, and
        the publish times only adaptive gossip reads."""
        if self.pubsub is None:
            return
        peers = self.pubsub.peers
        for members in (*self.mesh.values(), *self.fanout.values()):
            members.intersection_update(peers)
        self._forget_scores(peers)
        self._sweep_back_off(peers)
        if not self.adaptive_gossip_enabled:  # adaptive gossip trims it itself
            self.recent_message_deliveries.clear()

    def _forget_scores(self, peers: Iterable[ID]) -> None:
        """Scores of peers neither registered nor connected (a connected peer still
        registering keeps its penalties)."""
        if self.scorer is None or self.pubsub is None:
            return
        scored = set(self.scorer.time_in_mesh) | set(self.scorer.behavior_penalty)
        scored |= set(self.scorer.first_message_deliveries) | set(self.scorer.invalid_messages)
        scored |= set(self.scorer.mesh_message_deliveries) | set(self.scorer.ip_by_peer)
        for peer in scored.difference(peers):
            if not self.pubsub._peer_is_connected(peer):
                self.scorer.remove_peer(peer)

    def _sweep_back_off(self, peers: Iterable[ID]) -> None:
        now = int(time.time())
        live = set(peers)
        for topic, entries in list(self.back_off.items()):
            for peer, until in list(entries.items()):
                if until <= now or peer not in live:
                    del entries[peer]
            if not entries:
                del self.back_off[topic]

    def _is_pubsub_peer(self, peer_id: ID) -> bool:
        return self.pubsub is not None and peer_id in self.pubsub.peers


def gossip_peers(non_mesh_peers: int) -> int:
    """How many non-mesh peers of a topic one heartbeat's IHAVE goes to."""
    return max(GOSSIP_PEERS_MIN, int(non_mesh_peers * GOSSIP_FACTOR))
