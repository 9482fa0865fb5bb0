"""NAT traversal for one node: its relay slots and its local routes to other NATed peers.

- A node whose dial-back verdict is `private` keeps slots at up to 2 public peers (the
  bootstrap first) and names them in its peer record (`relays`): control/relay_slots.py.
- Two private peers reach each other through a route (control/routes.py: a 127.0.0.1 listener
  per peer and plane, closed when the peer leaves) that each plane dials instead of the peer's
  own addresses. Its connections are carried by a hole punch (TCP simultaneous open, signalled
  through the target's relays, up to PUNCH_ATTEMPTS times) or, when a punch times out (a
  symmetric NAT), relayed; a peer a punch timed out to is relayed for PUNCH_RETRY_S. How many
  punches, how often and to where: control/punch_limits.py; which peers need a route, and our
  control host's dials pinned to it: control/route_dials.py.
- The relay a public node serves is control/relay_service.py's.
- A public peer needs no route to a private one: the private peer dials it (both planes keep
  a connection either side may open streams on).

The kind of each peer's connection ("direct", "holepunched", "relayed") goes out with our link
measurements (LinkReport.connection), so the status document (`status`, the dashboard's JSON)
and `bench nat` see it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from p2ptrain.addresses import tcp_endpoint
from p2ptrain.control import relay_slots
from p2ptrain.control.punch_limits import PunchLimits, may_punch
from p2ptrain.control.relay_service import answer_one
from p2ptrain.control.route_dials import needs_route, pin_dials
from p2ptrain.control.routes import Routes
from p2ptrain.control.state import NodeState
from p2ptrain.errors import WireError
from p2ptrain.net import dial_gate
from p2ptrain.net.address_classes import may_dial
from p2ptrain.net.guard import start_contained
from p2ptrain.net.own_networks import machine_networks
from p2ptrain.records import Plan
from p2ptrain.records.peer import CONNECTIONS
from p2ptrain.records.relay import (
    RAW_CIRCUIT,
    RAW_HELLO_BYTES,
    RAW_PUNCHED,
    OfferAnswer,
    RawHello,
    RelayOffer,
    RelayRequest,
)
from p2ptrain.records.relay import split_endpoint as relay_split
from p2ptrain.traversal import relay
from p2ptrain.traversal.splice import splice

log = logging.getLogger(__name__)

PUNCH_RETRY_S = 300.0  # after a failed punch, relay that peer for this long
PUNCH_ATTEMPTS = 3  # signalled punches per connection before relaying (see reach)
# circuits spliced into us at once, relayed or punched (each holds two sockets and a loopback
# connection to our own port, which the inbound gate does not count): a relay is a member
MAX_CIRCUITS_IN = 64
_, HOLEPUNCHED, RELAYED = CONNECTIONS  # records/peer.py: how a link's bytes travel


class Traversal:
    """The NAT-traversal pieces of one control process (started by control/node.py)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        # (peer, plane) -> a local listener carried to it (control/routes.py)
        self.routes = Routes(lambda peer, plane: self.reach(peer, plane), self._planned, self._shut)
        self.connections: dict[tuple[str, str], str] = {}  # (peer, plane) -> HOLEPUNCHED/RELAYED
        self.punch_failed: dict[str, float] = {}  # peer -> when a punch to it last failed
        self.punching_in: set[tuple[str, str]] = set()  # (source, plane) offers we punch for
        self.punching_out: set[tuple[str, str]] = set()  # (peer, plane) we punch to
        self.circuits_in = 0  # punched and relayed circuits into us, open now
        self.limits_in, self.limits_out = PunchLimits(), PunchLimits()
        self.clock: Callable[[], float] = time.monotonic
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep our relay slots, and carry our routes' connections, while the node runs."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.routes.serve)
            nursery.start_soon(relay_slots.keep_reservations, self.state)
            task_status.started()

    def forget(self, peer: str) -> None:
        """`peer` left the membership: its routes close and what we noted of it goes."""
        self.routes.close(peer)
        self.punch_failed.pop(peer, None)
        self.connections = {key: kind for key, kind in self.connections.items() if key[0] != peer}
        self.state.view.links.connections.pop(peer, None)

    def _shut(self, port: int) -> None:  # a closed route's port is no longer ours to dial
        dial_gate.distrust(self.state.host, f"/ip4/127.0.0.1/tcp/{port}")

    def _planned(self) -> set[str]:  # their routes are never taken over
        return set(self.state.view.plan.peers()) if self.state.view.plan else set()

    # -- offers from our relays ---------------------------------------------------------------

    async def handle_offer(self, stream: INetStream) -> None:
        """OFFER_PROTOCOL, on a NATed node: a relay of ours says a peer wants to connect."""
        await answer_one(stream, RelayOffer.from_dict, self._take_offer, "relay offer")

    async def _take_offer(self, relay_id: str, _: str, offer: RelayOffer) -> OfferAnswer:
        local = self._local_port(offer.plane)
        raw = relay_slots.relay_endpoint(self.state, relay_id)
        nursery, why = self._nursery, ""
        if relay_id not in self.state.relays or local is None or raw is None or nursery is None:
            why = "not our relay" if relay_id not in self.state.relays else "not ready"
        elif offer.source not in self.state.view.members:
            # a relay may name anyone: a stranger is refused, and nothing is noted of it
            log.debug("refused an offer through %s from a non-member", relay_id)
            return OfferAnswer(accept=False)
        elif self.circuits_in >= MAX_CIRCUITS_IN:
            why = "taking in as many circuits as we may"
        elif not offer.endpoint:
            self.circuits_in += 1  # given back when the circuit ends, however it ends
            token = bytes.fromhex(offer.token)
            start_contained(nursery, "relayed in", self._relayed_in, offer, raw, token, local)
            return OfferAnswer(accept=True)
        else:
            seen = await relay.observe_from(raw)
            key = (offer.source, offer.plane)
            if not may_punch(self.punching_in, key):
                why = "punching as much as we may"
            elif not may_dial(relay_split(offer.endpoint)[0], [seen.local_ip], machine_networks()):
                why = f"{offer.endpoint} is not an address we dial"
            elif not (why := self.limits_in.refusal(offer.source, offer.endpoint, self.clock())):
                self.punching_in.add(key)
                self.circuits_in += 1  # given back when the circuit ends, however it ends
                token = bytes.fromhex(offer.token)
                args = (offer, seen.port, token, local)
                start_contained(nursery, "punched in", self._punched_in, *args)
                return OfferAnswer(accept=True, endpoint=seen.endpoint)
        log.info("refused an offer from %s through %s: %s", offer.source, relay_id, why)
        return OfferAnswer(accept=False)

    async def _punched_in(self, offer: RelayOffer, port: int, token: bytes, local: int) -> None:
        """Runs under the guard (net/guard.py): whatever the far end does ends only this. The
        punch holds its place among the punches until the connection has shown the offer's
        token, and among the circuits in until it ends; closed when idle, as a relayed one."""
        try:
            await self._punch_in(offer, port, token, local)
        finally:
            self.circuits_in -= 1

    async def _punch_in(self, offer: RelayOffer, port: int, token: bytes, local: int) -> None:
        try:
            # not marked as a failed punch when it fails: the dialer may have given up on the
            # signalling and never punched; only the dialer, whose punch timed out, learns the
            # NATs said no
            remote = await relay.punch(port, offer.endpoint)
            try:
                with trio.fail_after(relay.RAW_HELLO_TIMEOUT_S):
                    hello = RawHello.decode(await relay.receive_exact(remote, RAW_HELLO_BYTES))
                if hello.kind != RAW_PUNCHED or hello.token != token:
                    raise WireError("a punched connection without the offer's token")
                self.limits_in.proven(offer.endpoint)
                inner = await trio.open_tcp_stream("127.0.0.1", local)
            except BaseException:
                await _close(remote)
                raise
        finally:
            self.punching_in.discard((offer.source, offer.plane))
        self._note(offer.source, offer.plane, HOLEPUNCHED)
        await splice(remote, inner, idle_s=relay.CIRCUIT_IDLE_S)

    async def _relayed_in(
        self, offer: RelayOffer, raw: tuple[str, int], token: bytes, local: int
    ) -> None:
        """Runs under the guard, as _punched_in; closed when idle, as the relay closes it."""
        try:
            remote = await relay.open_raw(raw, RAW_CIRCUIT, token)
            try:
                inner = await trio.open_tcp_stream("127.0.0.1", local)
            except BaseException:
                await _close(remote)
                raise
            self._note(offer.source, offer.plane, RELAYED)
            await splice(remote, inner, idle_s=relay.CIRCUIT_IDLE_S)
        finally:
            self.circuits_in -= 1

    def _local_port(self, plane: str) -> int | None:  # the punched or relayed bytes go there
        addrs = self.state.addrs if plane == "control" else self.state.data_addrs
        for addr in addrs:
            endpoint = tcp_endpoint(addr)
            if endpoint is not None:
                return endpoint[1]
        return None

    # -- routes -----------------------------------------------------------------------------

    async def route(self, peer: str, plane: str) -> str | None:
        """The local multiaddr (with /p2p/) reaching `peer`'s plane; None: none can open now."""
        port = await self.routes.port(peer, plane)
        return None if port is None else f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"

    async def reach(self, peer: str, plane: str) -> trio.SocketStream | None:
        """A connection to `peer`'s plane: punched if we can, else relayed; None if neither."""
        member = self.state.view.members.get(peer)
        connected = {p.to_base58() for p in self.state.host.get_connected_peers()}
        # relays we are connected to first: a vanished relay costs a dial timeout
        relays = sorted(member.record.relays if member else (), key=lambda r: r not in connected)
        usable = [
            (r, raw)
            for r in relays
            if (raw := await relay_slots.dialled_relay(self.state, r)) is not None
        ]
        # punch first, signalled through each relay in turn (one attempt each, at most
        # PUNCH_ATTEMPTS): a relay that fails the signalling says nothing about the NATs, a
        # punch that times out does, and then we relay at once
        for relay_id, raw in (usable * PUNCH_ATTEMPTS)[:PUNCH_ATTEMPTS]:
            if self.clock() - self.punch_failed.get(peer, -1e9) <= PUNCH_RETRY_S:
                break
            stream = await self._try_punch(relay_id, raw, peer, plane)
            if stream is not None:
                self._note(peer, plane, HOLEPUNCHED)
                return stream
        for relay_id, raw in usable:
            try:
                reply = await relay_slots.request(
                    self.state, relay_id, RelayRequest("connect", peer, plane)
                )
                if reply.error:
                    log.info("relay %s refused a circuit to %s: %s", relay_id, peer, reply.error)
                    continue
                stream = await relay.open_raw(raw, RAW_CIRCUIT, bytes.fromhex(reply.token))
            except Exception as exc:
                log.info("no circuit to %s through %s: %s", peer, relay_id, exc)
                continue
            self._note(peer, plane, RELAYED)
            return stream
        log.info("cannot reach %s (%s plane): none of its relays answered", peer, plane)
        return None

    async def _try_punch(
        self, relay_id: str, raw: tuple[str, int], peer: str, plane: str
    ) -> trio.SocketStream | None:
        key = (peer, plane)
        if not may_punch(self.punching_out, key):
            log.info("no punch to %s (%s): punching as much as we may", peer, plane)
            return None
        self.punching_out.add(key)
        try:
            return await self._punch_out(relay_id, raw, peer, plane)
        finally:
            self.punching_out.discard(key)

    async def _punch_out(
        self, relay_id: str, raw: tuple[str, int], peer: str, plane: str
    ) -> trio.SocketStream | None:
        try:  # the signalling: a relay that fails it says nothing about the peer's NAT
            seen = await relay.observe_from(raw)
            request = RelayRequest("connect", peer, plane, seen.endpoint)
            reply = await relay_slots.request(self.state, relay_id, request)
        except Exception as exc:
            log.info("no punch signalled to %s through %s: %s", peer, relay_id, exc)
            return None
        if reply.error or not reply.endpoint:
            log.info("no punch to %s through %s: %s", peer, relay_id, reply.error or "no endpoint")
            return None
        if not may_dial(relay_split(reply.endpoint)[0], [seen.local_ip], machine_networks()):
            log.info("no punch to %s: %s is not an address we dial", peer, reply.endpoint)
            return None
        # never `proven` here: the proof is the plane's Noise handshake, past the splice
        if why := self.limits_out.refusal(peer, reply.endpoint, self.clock()):
            log.info("no punch to %s through %s: %s", peer, relay_id, why)
            return None
        stream = None
        try:
            stream = await relay.punch(seen.port, reply.endpoint)
            await stream.send_all(RawHello(RAW_PUNCHED, bytes.fromhex(reply.token)).encode())
            return stream
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            log.info("no hole punched to %s (%s): relaying", peer, type(exc).__name__)
            self.punch_failed[peer] = self.clock()
            if stream is not None:
                await _close(stream)
            return None

    async def pin_if_routed(self, peer: str) -> bool:
        """Discovery's hook: dial `peer` through its route if it needs one (and one is open)."""
        if not needs_route(self.state, peer):
            return False
        return await self.pin_control_route(peer)

    async def data_routes(self, plan: Plan) -> dict[str, tuple[str, ...]]:
        """The worker's routes to the plan's peers that need one."""
        routes: dict[str, tuple[str, ...]] = {}
        for peer in sorted(plan.peers()):
            if peer != self.state.peer_id and needs_route(self.state, peer):
                route = await self.route(peer, "data")
                if route is not None:
                    routes[peer] = (route,)
        return routes

    async def pin_control_route(self, peer: str) -> bool:
        """Make our control host dial `peer` through its route only (route_dials.pin_dials);
        False if no route could be opened."""
        peer_id = ID.from_base58(peer)
        addr = await self.route(peer, "control")
        if addr is None:
            return False
        pin_dials(self.state.host, peer_id, addr)
        return True

    def _note(self, peer: str, plane: str, kind: str) -> None:
        """A connection to `peer` now goes this way (the view shows the data plane's, if any).
        Members only: `forget` takes a member's entries when it leaves, and nobody else's stay."""
        if peer not in self.state.view.members:
            return
        if self.connections.get((peer, plane)) != kind:
            log.info("%s plane to %s: %s", plane, peer, kind)
        self.connections[(peer, plane)] = kind
        self.state.view.links.connections[peer] = self.connections.get((peer, "data"), kind)


async def _close(stream: trio.SocketStream) -> None:
    with contextlib.suppress(Exception):
        await stream.aclose()
