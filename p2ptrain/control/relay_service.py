"""The relay a node serves to NATed members (the client side is control/traversal.py).

A relay port (raw TCP: observed endpoints and the splicing of circuits, traversal/relay.py) and the
signalling protocol RELAY_PROTOCOL: a NATed member reserves a slot; another asks to reach it,
and the relay offers that connection to the reserved peer over OFFER_PROTOCOL (on the
connection the peer opened to us) and hands both sides the circuit's token (docs/protocols.md,
"Relays and hole punches").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2ptrain.addresses import tcp_endpoint
from p2ptrain.control.state import NodeState
from p2ptrain.errors import WireError
from p2ptrain.net.framing import read_frame, write_frame
from p2ptrain.net.host import connection_ips
from p2ptrain.net.stream_end import end, ending
from p2ptrain.records.fields import json_value
from p2ptrain.records.relay import OfferAnswer, RelayOffer, RelayReply, RelayRequest
from p2ptrain.traversal import relay

log = logging.getLogger(__name__)
T = TypeVar("T")


class Record(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


RELAY_PROTOCOL = TProtocol("/p2ptrain/relay/1.0.0")
OFFER_PROTOCOL = TProtocol("/p2ptrain/relay-offer/1.0.0")
MAX_MESSAGE_BYTES = 2048
SIGNAL_TIMEOUT_S = 10.0  # a request and its offer: two control-plane round trips and a dial
# the relay port, above the control port: 7420 beside a bootstrap's 7400, 7421 beside join's
# 7401 (clear of the data plane's 7402 and of a second node's 7411/7412 on one machine)
RELAY_PORT_OFFSET = 20


async def exchange(
    host: IHost, peer: str, protocol: TProtocol, message: dict[str, Any]
) -> dict[str, Any] | Any:
    """One request frame and one reply frame on a fresh stream to `peer` (JSON, undecoded)."""
    stream = await host.new_stream(ID.from_base58(peer), [protocol])
    async with ending(stream):  # reset when the caller's deadline ends it: net/stream_end.py
        await write_frame(stream, json.dumps(message).encode())
        return json_value(await read_frame(stream, MAX_MESSAGE_BYTES), "relay reply")


async def answer_one(
    stream: INetStream,
    decode: Callable[[object], T],
    answer: Callable[[str, str, T], Awaitable[Record]],
    what: str,
) -> None:
    """A stream handler's whole exchange: one request frame (`decode`d), one reply frame
    (`answer`(the sender's peer id, the address its connection comes from, the request)), within
    SIGNAL_TIMEOUT_S; bad input is logged and dropped, and the stream closed either way."""
    try:
        with trio.fail_after(SIGNAL_TIMEOUT_S):
            request = decode(json_value(await read_frame(stream, MAX_MESSAGE_BYTES), what))
            sender = stream.muxed_conn.peer_id.to_base58()
            reply = await answer(sender, stream_ip(stream), request)
            await write_frame(stream, json.dumps(reply.to_dict()).encode())
    except (WireError, ValueError, RecursionError) as exc:
        log.info("dropped a bad %s: %s", what, exc)
    except Exception as exc:  # a vanished peer is not our problem
        log.debug("%s failed: %s", what, exc)
    finally:
        await end(stream, clean=True)  # bounded, whatever cancelled us


def stream_ip(stream: INetStream) -> str:
    """The remote IP of a stream's connection as our socket sees it ('' if unknown)."""
    try:
        address = stream.get_remote_address()
    except Exception:  # a library connection without one
        return ""
    return str(address[0]) if address else ""


class RelayService:
    """Slots and circuits for the run's members, within traversal/relay.py's limits."""

    def __init__(self, state: NodeState, may_use: Callable[[str], bool]) -> None:
        self.state = state
        self.server = relay.RelayServer(may_use, state.relay)

    async def serve(
        self, listen_host: str, control_port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the relay port (our control host, RELAY_PORT_OFFSET above the control port, or
        any free port if that one is taken or the control port is) and serve it."""
        port = control_port + RELAY_PORT_OFFSET if control_port else 0
        try:
            listeners = await trio.open_tcp_listeners(port, host=listen_host)
        except OSError as exc:
            log.warning("relay port %d unavailable (%s): relaying on a free port", port, exc)
            listeners = await trio.open_tcp_listeners(0, host=listen_host)
        port = listeners[0].socket.getsockname()[1]
        hosts = [tcp_endpoint(a) for a in self.state.addrs]
        self.state.relay_addrs = list(
            dict.fromkeys(f"/ip4/{e[0]}/tcp/{port}" for e in hosts if e is not None)
        )
        await self.server.serve_raw(listeners[0], task_status=task_status)

    async def handle_request(self, stream: INetStream) -> None:
        """RELAY_PROTOCOL: a reservation, or a connect to a reserved peer."""
        await answer_one(stream, RelayRequest.from_dict, self._answer, "relay request")

    async def _answer(self, source: str, source_ip: str, request: RelayRequest) -> RelayReply:
        now = time.monotonic()
        if request.op == "reserve":
            error = self.server.reserve(source, now, source_ip)
            return RelayReply(error=error, expires_s=0.0 if error else relay.RESERVATION_TTL_S)
        # a punch endpoint is forwarded only as our raw port observed it from the source's
        # address: nobody makes a target send SYNs anywhere but at the source itself
        endpoint = self.server.vouch(source_ip, request.endpoint, trio.current_time())
        if request.endpoint and not endpoint:
            return RelayReply(error="punch endpoint not observed from your address")
        error, token = self.server.grant(source, request.target, now, source_ip)
        if error:
            return RelayReply(error=error)
        offer = RelayOffer(source, request.plane, token.hex(), endpoint)
        try:
            answer = OfferAnswer.from_dict(
                await exchange(self.state.host, request.target, OFFER_PROTOCOL, offer.to_dict())
            )
        except Exception as exc:
            self.server.pending.pop(token, None)
            return RelayReply(error=f"the target did not answer: {type(exc).__name__}")
        if not answer.accept:
            self.server.pending.pop(token, None)
            return RelayReply(error="the target refused")
        if endpoint:  # a punch: no circuit to pair
            self.server.pending.pop(token, None)
        # and the target's endpoint likewise, as observed from its connection to us
        ips, t = sorted(connection_ips(self.state.host, request.target)), trio.current_time()
        vouched = [e for ip in ips if (e := self.server.vouch(ip, answer.endpoint, t))]
        target_endpoint = vouched[0] if vouched else ""
        if answer.endpoint and not target_endpoint:
            log.info("dropped %s's punch endpoint: not observed from its address", request.target)
        return RelayReply(token=token.hex(), endpoint=target_endpoint)
