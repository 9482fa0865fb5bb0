"""Dialling a NATed peer through our local route to it (control/routes.py): which peers need
one, and the control host's dials pinned to the route's address alone.

Apart from control/traversal.py, which carries a route's connections (punched or relayed): this
is the dialling side discovery and the worker link rely on, and it speaks to py-libp2p's
peerstore and our dial gate, not to relays.
"""

from __future__ import annotations

from libp2p.abc import IHost
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from p2ptrain.control.state import NodeState
from p2ptrain.net import dial_gate

PEERSTORE_TTL_S = 3600


def needs_route(state: NodeState, peer: str) -> bool:
    """Both of us behind NATs, and the peer holds relay slots: dial it through a route."""
    member = state.view.members.get(peer)
    return (
        state.reachability == "private"
        and member is not None
        and member.record.reachability == "private"
        and bool(member.record.relays)
    )


def pin_dials(host: IHost, peer_id: ID, addr: str) -> None:
    """Make `host` dial `peer_id` at our route's `addr` (with /p2p/) only: py-libp2p drops
    loopback addresses when any other is known, and blocks a peer for 60 s after failed dials;
    the dial gate, net/dial_gate.py, lets a node off loopback dial there only to our routes."""
    dial_gate.trust(host, addr)
    peerstore = host.get_peerstore()
    peerstore.clear_addrs(peer_id)
    peerstore.add_addrs(peer_id, [Multiaddr(addr.rsplit("/p2p/", 1)[0])], PEERSTORE_TTL_S)
    cache = getattr(host.get_network(), "_negative_peer_cache", None)
    if cache is not None:
        cache.evict(str(peer_id))
