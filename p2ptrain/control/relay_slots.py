"""A NATed node's relay slots: it keeps slots at up to WANTED_RELAYS public members (the
bootstrap first) and names them in its peer record (`relays`); and the raw relay port of a
relay, found only at an address our connection to it comes from (control/traversal.py dials
and punches through it). The relay a public node serves is control/relay_service.py's.
"""

from __future__ import annotations

import contextlib
import logging

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from p2ptrain.addresses import tcp_endpoint
from p2ptrain.control.relay_service import RELAY_PROTOCOL, SIGNAL_TIMEOUT_S, exchange
from p2ptrain.control.state import NodeState
from p2ptrain.net.host import connection_ips
from p2ptrain.records.relay import RelayReply, RelayRequest

log = logging.getLogger("p2ptrain.control.traversal")  # as before the split: operators grep it

WANTED_RELAYS = 2  # slots a private node keeps: one relay may vanish mid-run
RENEW_INTERVAL_S = 45.0  # well inside relay.RESERVATION_TTL_S
RESERVE_RETRY_S = 5.0  # while we hold fewer slots than wanted


def relay_endpoint(state: NodeState, peer: str) -> tuple[str, int] | None:
    """A relay's raw port, from its peer record: only at an address our connection to that
    peer comes from. A record's relay_addrs are its word; we never connect (and observe,
    and punch from) an address a member named unless it is where the member is."""
    member = state.view.members.get(peer)
    if member is None:
        return None
    ips = connection_ips(state.host, peer)
    for addr in member.record.relay_addrs:
        endpoint = tcp_endpoint(addr)
        if endpoint is not None and endpoint[0] in ips:
            return endpoint
    return None


async def dialled_relay(state: NodeState, peer: str) -> tuple[str, int] | None:
    """`relay_endpoint`, connecting to the relay first if we have no connection to it."""
    host = state.host
    if not connection_ips(host, peer):
        with contextlib.suppress(Exception), trio.move_on_after(SIGNAL_TIMEOUT_S):
            peer_id = ID.from_base58(peer)
            await host.connect(PeerInfo(peer_id, host.get_peerstore().addrs(peer_id)))
    return relay_endpoint(state, peer)


def relay_candidates(state: NodeState) -> list[str]:
    """Public members with a relay port that we are connected to, the bootstrap first."""
    view = state.view
    connected = {peer.to_base58() for peer in state.host.get_connected_peers()}
    found = [
        peer
        for peer, member in list(view.members.items())
        if peer in connected
        and peer != state.peer_id
        and member.record.relay_addrs
        and (member.record.reachability == "public" or peer == view.bootstrap_id)
    ]
    return sorted(found, key=lambda peer: peer != view.bootstrap_id)


async def keep_reservations(state: NodeState) -> None:
    """While the node runs: hold slots while our verdict is `private`, none otherwise."""
    await state.joined.wait()
    while True:
        if state.reachability != "private":
            if state.relays:
                state.relays = []
                state.publish_soon("record")
            await trio.sleep(RESERVE_RETRY_S)
            continue
        held: list[str] = []
        for peer in relay_candidates(state):
            if len(held) >= WANTED_RELAYS:
                break
            if await reserve(state, peer):
                held.append(peer)
        if held != state.relays:
            log.info("relay slots held at %s", ", ".join(held) or "no peer")
            state.relays = held
            state.publish_soon("record")
        await trio.sleep(RENEW_INTERVAL_S if len(held) >= WANTED_RELAYS else RESERVE_RETRY_S)


async def reserve(state: NodeState, peer: str) -> bool:
    try:
        reply = await request(state, peer, RelayRequest("reserve"))
    except Exception as exc:
        log.debug("reservation at %s failed: %s", peer, exc)
        return False
    if reply.error:
        log.info("reservation at %s refused: %s", peer, reply.error)
    return not reply.error


async def request(state: NodeState, peer: str, message: RelayRequest) -> RelayReply:
    """One relay request to `peer` and its reply, within SIGNAL_TIMEOUT_S."""
    with trio.fail_after(SIGNAL_TIMEOUT_S):
        reply = await exchange(state.host, peer, RELAY_PROTOCOL, message.to_dict())
    return RelayReply.from_dict(reply)
