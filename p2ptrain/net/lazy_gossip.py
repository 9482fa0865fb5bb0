"""py-libp2p 0.8.1's GossipSub with its lazy gossip bounded.

Each heartbeat, GossipSub sends IHAVE (the ids of the messages of its last heartbeats) to peers of
a topic outside its mesh: py-libp2p picks max(6, a quarter of them), both hard-wired (the spec's
D_lazy and gossip factor). Gossip only repairs what the mesh failed to deliver, and our sync pulls
whatever both missed (control/sync.py). At 32 peers on one machine IHAVE was 2.2 of a member's
~8 pubsub writes a second, each a frame through yamux and noise. So fewer: GOSSIP_PEERS_MIN and
GOSSIP_FACTOR of the others (3 at 32 peers, 10 at 100, 100 at 1,000).
"""

from __future__ import annotations

from libp2p.pubsub.gossipsub import GossipSub

GOSSIP_PEERS_MIN = 3
GOSSIP_FACTOR = 0.1


class LazyGossipSub(GossipSub):
    """GossipSub whose IHAVE goes to max(GOSSIP_PEERS_MIN, GOSSIP_FACTOR x the non-mesh peers)."""

    def _get_adaptive_gossip_peers_count(self, topic: str, total_peers: int) -> int:
        return gossip_peers(total_peers)


def gossip_peers(non_mesh_peers: int) -> int:
    """How many non-mesh peers of a topic one heartbeat's IHAVE goes to."""
    return max(GOSSIP_PEERS_MIN, int(non_mesh_peers * GOSSIP_FACTOR))
