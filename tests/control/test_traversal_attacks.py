"""Findings 1 and 4 of issue 26, against a NATed node's traversal (control/traversal.py) with real
sockets on 127.0.0.1: a relay port of ours, and an "attacker" endpoint the node is offered to
punch to. The node's host and view are stand-ins: the offer arrives as the relay's stream would
bring it (one frame in, one frame out)."""

from __future__ import annotations

import json
import socket
import struct
import time
from types import SimpleNamespace
from typing import Any

import trio

from p2ptrain.control import relay_service
from p2ptrain.control import traversal as traversal_module
from p2ptrain.control.punch_limits import MAX_PUNCHES
from p2ptrain.control.traversal import MAX_CIRCUITS_IN, Traversal
from p2ptrain.records.relay import (
    RAW_PUNCHED,
    OfferAnswer,
    RawHello,
    RelayOffer,
    RelayReply,
    RelayRequest,
)
from p2ptrain.traversal import relay
from p2ptrain.traversal.splice import RelayCounters
from tests.net.trio_run import run

RELAY = "12D3KooWA1111111111111111111111111111111111111111111"
SOURCE = "12D3KooWB2222222222222222222222222222222222222222222"
TARGET = "12D3KooWC3333333333333333333333333333333333333333333"
TOKEN = "ab" * 16


class OneFrameStream:
    """A relay's OFFER_PROTOCOL stream as the handler sees it: one request frame, its reply."""

    def __init__(self, message: dict[str, Any], sender: str) -> None:
        payload = json.dumps(message).encode()
        self.incoming = struct.pack(">I", len(payload)) + payload
        self.written = b""
        self.muxed_conn = SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda: sender))

    async def read(self, num_bytes: int) -> bytes:
        chunk, self.incoming = self.incoming[:num_bytes], self.incoming[num_bytes:]
        return chunk

    async def write(self, data: bytes) -> None:
        self.written += data

    async def close(self) -> None:
        pass

    def get_remote_address(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def reply(self) -> dict[str, Any]:
        return dict(json.loads(self.written[4:]))


def loopback_host() -> Any:
    """A host whose one connection (to anyone) comes from 127.0.0.1."""
    connection = SimpleNamespace(
        muxed_conn=SimpleNamespace(get_remote_address=lambda: ("127.0.0.1", 4001))
    )
    network = SimpleNamespace(get_connections=lambda peer_id: [connection])
    return SimpleNamespace(get_network=lambda: network, get_connected_peers=lambda: [])


def nated_node(relay_port: int) -> Traversal:
    record = SimpleNamespace(relay_addrs=(f"/ip4/127.0.0.1/tcp/{relay_port}",))
    members = {RELAY: SimpleNamespace(record=record), SOURCE: SimpleNamespace(record=None)}
    view = SimpleNamespace(members=members, connections={})
    state = SimpleNamespace(
        relays=[RELAY],
        addrs=["/ip4/127.0.0.1/tcp/9"],
        data_addrs=["/ip4/127.0.0.1/tcp/9"],
        view=view,
        host=loopback_host(),
        joined=trio.Event(),  # never set: no reservations are kept here
    )
    return Traversal(state)  # type: ignore[arg-type]


async def offer(
    traversal: Traversal, endpoint: str, plane: str = "data", source: str = SOURCE
) -> dict[str, Any]:
    stream = OneFrameStream(RelayOffer(source, plane, TOKEN, endpoint).to_dict(), RELAY)
    await traversal.handle_offer(stream)  # type: ignore[arg-type]
    return stream.reply()


async def reset_mid_hello(listener: trio.SocketListener) -> None:
    """The attacker's end of a punch: accept, send part of a hello, reset the connection."""
    while True:
        stream = await listener.accept()
        await stream.send_all(b"\x03abc")
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()


async def hold_silently(listener: trio.SocketListener) -> None:
    held = []
    while True:
        held.append(await listener.accept())


async def circuits_left(traversal: Traversal, within_s: float) -> int:
    """The circuits still counted in once they all ended, or after `within_s`."""
    with trio.move_on_after(within_s):
        while traversal.circuits_in:  # noqa: ASYNC110 - no event to wait on
            await trio.sleep(0.05)
    return traversal.circuits_in


async def relay_port(nursery: trio.Nursery) -> int:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(relay.RelayServer(lambda peer: True).serve_raw, listeners[0])
    return int(listeners[0].socket.getsockname()[1])


async def attacker(nursery: trio.Nursery, behaviour: Any) -> str:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(behaviour, listeners[0])
    return f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"


def test_a_punched_connection_reset_mid_hello_ends_only_itself() -> None:
    """Finding 1: the reset raised trio.BrokenResourceError out of the node-lifetime nursery."""

    async def main() -> tuple[list[bool], bool]:
        async with trio.open_nursery() as nursery:
            traversal = nated_node(await relay_port(nursery))
            await nursery.start(traversal.serve)
            accepted = []
            for _ in range(3):  # each from a fresh endpoint: one that never proved is backed off
                endpoint = await attacker(nursery, reset_mid_hello)
                accepted.append(bool((await offer(traversal, endpoint))["accept"]))
                await trio.sleep(0.5)  # the punch connects, then the far side resets it
            still_serving = traversal._nursery is not None and not traversal.punching_in
            nursery.cancel_scope.cancel()
        return accepted, still_serving

    accepted, still_serving = run(main)
    assert accepted == [True, True, True] and still_serving


def test_a_routes_connection_that_fails_to_be_carried_ends_only_itself() -> None:
    """Finding 1, routes: a carried connection whose far side broke ended the node."""

    async def broken_reach(peer: str, plane: str) -> Any:
        raise trio.BrokenResourceError("the far side reset the connection")

    async def main() -> tuple[list[bytes], bool]:
        async with trio.open_nursery() as nursery:
            traversal = nated_node(await relay_port(nursery))
            await nursery.start(traversal.serve)
            traversal.reach = broken_reach  # type: ignore[method-assign]
            address = await traversal.route(TARGET, "data")
            port = int(address.split("/")[4])
            answers = []
            for _ in range(3):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                with trio.fail_after(5):
                    answers.append(await stream.receive_some(1))
                await stream.aclose()
            serving = traversal._nursery is not None
            nursery.cancel_scope.cancel()
        return answers, serving

    answers, serving = run(main)
    assert answers == [b""] * 3 and serving


def test_offers_to_punch_where_we_never_dial_or_past_the_caps_are_refused() -> None:
    """Finding 4: an offer made the node SYN any IPv4:port, as many at once as offered."""

    async def main() -> tuple[list[bool], list[bool], bool]:
        async with trio.open_nursery() as nursery:
            traversal = nated_node(await relay_port(nursery))
            await nursery.start(traversal.serve)
            # a loopback node dials loopback; private, link-local, broadcast: never
            where = ["10.1.2.3:80", "169.254.1.1:80", "192.168.0.1:22", "255.255.255.255:9"]
            elsewhere = [bool((await offer(traversal, e))["accept"]) for e in where]
            endpoint = await attacker(nursery, hold_silently)
            first = (await offer(traversal, endpoint, "data"))["accept"]
            again = (await offer(traversal, endpoint, "data"))["accept"]  # same source, plane
            # fresh endpoints below, as an honest dialer's: a punched one is backed off
            other_plane = (
                await offer(traversal, await attacker(nursery, hold_silently), "control")
            )["accept"]
            traversal.punching_in.update((f"p{i}", "data") for i in range(MAX_PUNCHES))
            over_cap = (await offer(traversal, await attacker(nursery, hold_silently)))["accept"]
            nursery.cancel_scope.cancel()
        return elsewhere, [first, again, other_plane], over_cap

    elsewhere, same_source, over_cap = run(main)
    assert elsewhere == [False] * 4
    assert same_source == [True, False, True] and not over_cap


def test_the_relay_forwards_only_endpoints_it_observed(monkeypatch: Any) -> None:
    """Finding 4, the relay's side: the requester's endpoint and the target's answer are both
    replaced by what the relay port observed from each one's address, or dropped."""
    offers: list[dict[str, Any]] = []

    async def target_answers(host: Any, peer: str, protocol: Any, message: Any) -> Any:
        offers.append(message)
        return OfferAnswer(accept=True, endpoint="10.9.9.9:80").to_dict()  # a hostile target

    monkeypatch.setattr(relay_service, "exchange", target_answers)
    state = SimpleNamespace(relay=RelayCounters(), host=loopback_host())
    service = relay_service.RelayService(state, lambda peer: True)  # type: ignore[arg-type]

    async def main() -> tuple[RelayReply, RelayReply]:
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            await nursery.start(service.server.serve_raw, listeners[0])
            address = ("127.0.0.1", int(listeners[0].socket.getsockname()[1]))
            _, port = await relay.observe(address)
            service.server.reserve(TARGET, time.monotonic())
            made_up = RelayRequest("connect", TARGET, "data", "8.8.4.4:53")
            refused = await service._answer(SOURCE, "127.0.0.1", made_up)
            honest = RelayRequest("connect", TARGET, "data", f"9.9.9.9:{port}")
            granted = await service._answer(SOURCE, "127.0.0.1", honest)
            nursery.cancel_scope.cancel()
        return refused, granted

    refused, granted = run(main)
    assert refused.error == "punch endpoint not observed from your address"
    assert len(offers) == 1 and offers[0]["endpoint"].startswith("127.0.0.1:")
    assert granted.error == "" and granted.endpoint == ""  # the target's own word is dropped


def test_a_real_hosts_connection_and_stream_show_where_the_peer_is() -> None:
    """Both checks above read the address our socket sees for a peer, from py-libp2p's
    connection (relay_addrs, the target's endpoint) and stream (the requester's endpoint)."""
    from tests.net.test_protocols import ECHO, host_pair

    async def main() -> tuple[set[str], set[str], list[str]]:
        seen: list[str] = []
        noted = trio.Event()

        async def note(stream: Any) -> None:
            seen.append(relay_service.stream_ip(stream))
            noted.set()
            await stream.close()

        async with host_pair() as (a, b):
            b.set_stream_handler(ECHO, note)
            stream = await a.new_stream(b.get_id(), [ECHO])
            await stream.close()
            with trio.fail_after(5):
                await noted.wait()
            a_sees = relay_service.connection_ips(a, b.get_id().to_base58())
            b_sees = relay_service.connection_ips(b, a.get_id().to_base58())
        return a_sees, b_sees, seen

    a_sees, b_sees, seen = run(main)
    assert a_sees == b_sees == {"127.0.0.1"} and seen == ["127.0.0.1"]


def test_relayed_in_offers_past_the_cap_are_refused_and_ended_circuits_give_back() -> None:
    """A relay of ours offering circuits in a loop: each held two sockets and a task, unbounded.
    Past MAX_CIRCUITS_IN the offers are refused; a circuit that ends (here the relay port refuses
    the unknown token) gives its place back."""

    async def main() -> tuple[bool, bool, int]:
        async with trio.open_nursery() as nursery:
            traversal = nated_node(await relay_port(nursery))
            await nursery.start(traversal.serve)
            traversal.circuits_in = MAX_CIRCUITS_IN
            over_cap = bool((await offer(traversal, ""))["accept"])
            traversal.circuits_in = 0
            under_cap = bool((await offer(traversal, ""))["accept"])
            left = await circuits_left(traversal, 5.0)  # the relay port refuses the token at once
            nursery.cancel_scope.cancel()
        return over_cap, under_cap, left

    over_cap, under_cap, left = run(main)
    assert not over_cap and under_cap and left == 0


def test_a_punched_circuit_counts_until_it_ends(monkeypatch: Any) -> None:
    """A member whose punches complete (its hello shows the offer's token) and then holds
    them: each circuit splices into our own port from 127.0.0.1 (the inbound gate exempts it).
    They counted only while punching: 40 offers, 40 circuits held. Now they share the circuits'
    cap for their life, and an idle one is closed."""
    monkeypatch.setattr(relay, "CIRCUIT_IDLE_S", 6.0)  # past the offers below, however slow
    cap = 4
    monkeypatch.setattr(traversal_module, "MAX_CIRCUITS_IN", cap)

    async def punch_and_hold(listener: trio.SocketListener) -> None:
        held = []
        while True:
            stream = await listener.accept()
            await stream.send_all(RawHello(RAW_PUNCHED, bytes.fromhex(TOKEN)).encode())
            held.append(stream)  # and never a byte more

    async def main() -> tuple[int, int, int]:
        async with trio.open_nursery() as nursery:
            traversal = nated_node(await relay_port(nursery))
            traversal.state.view.links = SimpleNamespace(connections={})  # where _note writes
            own = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            port = own.socket.getsockname()[1]
            traversal.state.addrs = traversal.state.data_addrs = [f"/ip4/127.0.0.1/tcp/{port}"]
            reached: list[trio.SocketStream] = []

            async def our_port() -> None:
                while True:
                    reached.append(await own.accept())

            nursery.start_soon(our_port)
            await nursery.start(traversal.serve)
            endpoint = await attacker(nursery, punch_and_hold)
            accepted = 0
            for _ in range(3 * cap):
                accepted += bool((await offer(traversal, endpoint))["accept"])
                await trio.sleep(0.05)  # the punch completes and leaves the punches' cap
            held = traversal.circuits_in
            left = await circuits_left(traversal, 20.0)  # idle for CIRCUIT_IDLE_S: closed
            nursery.cancel_scope.cancel()
        return accepted, held, left

    accepted, held, left = run(main)
    assert (accepted, held) == (cap, cap), (accepted, held, left)
    assert left == 0


def test_offers_from_non_members_are_refused_and_leave_nothing_behind() -> None:
    """A relay of ours offering circuits, each from a fresh made-up source: each was taken, and
    the source noted (in our connections and the links we gossip) for good. Now a source must
    be a member, only members are noted, and a member's entries go when it leaves."""
    stranger = "12D3KooWD4444444444444444444444444444444444444444444"

    async def main() -> tuple[bool, bool, Traversal]:
        async with trio.open_nursery() as nursery:
            traversal = nated_node(await relay_port(nursery))
            links = SimpleNamespace(connections={})  # where _note writes
            traversal.state.view.links = links  # type: ignore[assignment]
            await nursery.start(traversal.serve)
            stranger_taken = bool((await offer(traversal, "", source=stranger))["accept"])
            member_taken = bool((await offer(traversal, ""))["accept"])
            await circuits_left(traversal, 5.0)  # the relay port refuses the token at once
            nursery.cancel_scope.cancel()
        return stranger_taken, member_taken, traversal

    stranger_taken, member_taken, traversal = run(main)
    assert not stranger_taken and member_taken
    links = traversal.state.view.links
    traversal._note(stranger, "data", "relayed")  # a circuit from one: nothing noted
    assert traversal.connections == {} and links.connections == {}
    traversal._note(SOURCE, "data", "relayed")
    assert links.connections == {SOURCE: "relayed"}
    traversal.routes = SimpleNamespace(close=lambda peer: None)
    traversal.forget(SOURCE)  # it left the membership
    assert traversal.connections == {} and links.connections == {}
