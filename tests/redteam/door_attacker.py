"""A hostile process at a live swarm's doors (issue 26): the relay port, punch offers, dial-back,
library protocols, gossip from token holders, and many identities.

    python -m tests.redteam.door_attacker --duration S --victim HOST:PORT --run-id RUN
        --member KEY:TOKEN --member KEY:TOKEN ADDR [ADDR ...]

ADDR: the honest nodes' control multiaddrs, the bootstrap's first (their relay ports are read
from their records, as the bootstrap's sync serves them to any member); --victim: a listener outside the swarm that no honest node may ever connect to, so every
attack that could make a node connect somewhere aims there; --member: two identities the
organiser issued tokens to (attacks "as a token holder would"; their records say "observer",
a role no plan places: a token holder that says "control-only" or "trainer" is a peer the
planner may place, and one without a worker stalls the plan, see docs/security.md, 7). Prints its peer ids (a JSON list) first, then, for S
seconds, repeats in rounds (issue 26's numbering):
 0  garbage frames on GossipSub, identify, identify-push and Kademlia streams;
 1  a relayed circuit between the two members, reset mid-way by one end;
 2  ~1,000 idle TCP connections at the relay ports;
 4  punch requests and offers whose endpoint is the victim;
 5  records (the stranger's and Sybils') declaring the victim as their addresses;
 6  dial-back requests naming the victim;
 8  telemetry with losses and rates of 1e308 from both members;
 10 a dial-back server (the members') that says "reached" to whoever asks;
 11 relay slots from Sybils, circuits to oneself, grants past the per-pair cap;
 13 floods of valid signed records and telemetry;
 15 many identities, each holding idle inbound streams at every node.
Its last stdout line is a JSON summary: how many of each went out, and what came back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.addresses import tcp_endpoint
from p2ptrain.control import wire
from p2ptrain.control.gossip import CONTROL_TOPIC, TELEMETRY_TOPIC
from p2ptrain.control.relay_service import OFFER_PROTOCOL, RELAY_PROTOCOL
from p2ptrain.control.sync import SYNC_PROTOCOL
from p2ptrain.net import rpc
from p2ptrain.net.framing import read_frame, write_frame
from p2ptrain.net.host import make_host, run_trio
from p2ptrain.net.paging import cursor_request, next_cursor
from p2ptrain.procs import raise_open_file_limit
from p2ptrain.records import PeerRecord
from p2ptrain.records.relay import RAW_CIRCUIT, RawHello
from p2ptrain.traversal.dialback import DIALBACK_PROTOCOL
from tests.control.attacker import Attacker, open_attacker
from tests.redteam.members import huge_telemetry, member_record, open_member, serve_lies

GARBAGE_PROTOCOLS = [
    TProtocol(p)
    for p in ("/meshsub/1.1.0", "/ipfs/id/1.0.0", "/ipfs/id/push/1.0.0", "/ipfs/kad/1.0.0")
]
IDLE_CONNECTIONS = 1000  # each round, at the first relay port (a tenth at each other one)
IDLE_HOLD_S = 4.0
NUM_SYBILS = 12
STREAMS_PER_SYBIL = 8  # per node: the per-peer cap, 12 x 8 = 96 > a quarter of 256
GRANTS_PER_ROUND = 12  # one member asking for the other, past the per-pair cap of 8
FLOOD_PER_ROUND = 100
MESSAGE_TIMEOUT_S = 12.0


def peer_of(addr: str) -> str:
    return str(info_from_p2p_addr(Multiaddr(addr)).peer_id)


class Doors:
    """The attacker's identities and what they did (`counts`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.addrs: list[str] = args.addrs
        self.victims = [peer_of(a) for a in self.addrs]
        self.run_id: str = args.run_id
        host, port = args.victim.rsplit(":", 1)
        self.victim_ip, self.victim_port = host, int(port)
        self.victim_maddr = f"/ip4/{host}/tcp/{port}"
        self.relays: list[tuple[str, int]] = []  # the nodes' relay ports, the bootstrap's first
        self.relay_of: dict[str, tuple[str, int]] = {}  # node -> its relay port
        self.counts: Counter[str] = Counter()

    async def attempt(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        """One family's turn: a failure of ours is counted and printed, and the others go on."""
        try:
            await work()
        except Exception:
            self.counts[f"{name}_crashed"] += 1
            traceback.print_exc()

    def sign(self, seed: bytes, kind: str, seq: int, body: dict[str, Any]) -> bytes:
        return wire.sign(seed, kind, seq, body, run_id=self.run_id)

    async def exchange(self, host: Any, peer: str, protocol: TProtocol, message: Any) -> Any:
        """One frame out, one frame back (None if the node closed or refused)."""
        with trio.move_on_after(MESSAGE_TIMEOUT_S):
            try:
                stream = await host.new_stream(ID.from_base58(peer), [protocol])
            except Exception:
                return None
            try:
                await write_frame(stream, json.dumps(message).encode())
                return json.loads(await read_frame(stream, 64 * 1024))
            except Exception:
                return None
            finally:
                with contextlib.suppress(Exception):
                    await stream.reset()
        return None

    async def find_relays(self, member: Attacker) -> None:
        """The relay ports the nodes' records announce, from the bootstrap's sync."""
        found: dict[str, tuple[str, int]] = {}
        cursor: int | None = 0
        while cursor is not None:
            request = cursor_request(cursor)
            reply = await rpc.call(
                member.host, ID.from_base58(self.victims[0]), SYNC_PROTOCOL, request
            )
            for text in reply["envelopes"]:
                with contextlib.suppress(wire.WireError):
                    env = wire.decode(str(text).encode())
                    if isinstance(env.body, PeerRecord) and env.author in self.victims:
                        for addr in env.body.relay_addrs[:1]:
                            endpoint = tcp_endpoint(addr)
                            if endpoint is not None:
                                found[env.author] = endpoint
            cursor = next_cursor(reply, cursor)
        self.relay_of = found
        self.relays = [found[peer] for peer in self.victims if peer in found]
        self.counts["relay_ports_found"] = len(self.relays)
        self.counts["bootstrap_relay_found"] = int(self.victims[0] in found)

    # --- 0: garbage frames on library protocols
    async def garbage(self, host: Any) -> None:
        frame = b"\x40" + b"\xff" * 64  # a varint length of 64, then 64 bytes of 0xff
        for peer in self.victims:
            for protocol in GARBAGE_PROTOCOLS:
                try:
                    stream = await host.new_stream(ID.from_base58(peer), [protocol])
                    await stream.write(frame + struct.pack(">I", 64) + b"\xff" * 64)
                    self.counts["garbage_frames"] += 1
                    with trio.move_on_after(0.5):
                        await stream.read(1024)
                    await stream.reset()
                except Exception:
                    self.counts["garbage_refused"] += 1

    # --- 2: idle TCP connections at the relay ports
    async def idle_connections(self) -> None:
        held: list[trio.SocketStream] = []
        # the bootstrap's port (the first) gets the whole flood, the others a share
        shares = [IDLE_CONNECTIONS] + [IDLE_CONNECTIONS // 10] * (len(self.relays) - 1)
        if not self.counts["bootstrap_relay_found"]:
            shares = [IDLE_CONNECTIONS // 10] * len(self.relays)

        async def one(endpoint: tuple[str, int]) -> None:
            try:
                held.append(await trio.open_tcp_stream(*endpoint))
                self.counts["idle_connections"] += 1
            except OSError:
                self.counts["idle_refused"] += 1

        async with trio.open_nursery() as nursery:
            for endpoint, share in zip(self.relays, shares, strict=True):
                for _ in range(share):
                    nursery.start_soon(one, endpoint)
        await trio.sleep(IDLE_HOLD_S)
        for stream in held:
            with contextlib.suppress(Exception):
                await stream.aclose()

    # --- 4: punches aimed at the victim; 6: dial-back at the victim
    async def aim_at_victim(self, host: Any, me: str) -> None:
        endpoint = f"{self.victim_ip}:{self.victim_port}"
        for relay in self.victims:
            for target in self.victims:
                request = {
                    "op": "connect",
                    "target": target,
                    "plane": "control",
                    "endpoint": endpoint,
                }
                reply = await self.exchange(host, relay, RELAY_PROTOCOL, request)
                self.counts["punch_requests"] += 1
                if isinstance(reply, dict) and not reply.get("error"):
                    self.counts["punch_requests_granted"] += 1
            offer = {
                "source": me,
                "plane": "control",
                "token": os.urandom(16).hex(),
                "endpoint": endpoint,
            }
            answer = await self.exchange(host, relay, OFFER_PROTOCOL, offer)
            self.counts["punch_offers"] += 1
            if isinstance(answer, dict) and answer.get("accept"):
                self.counts["punch_offers_accepted"] += 1
            asked = [
                self.victim_maddr,
                f"/ip4/127.0.0.1/tcp/{self.victim_port}",
                f"/dns4/localhost/tcp/{self.victim_port}",
            ]
            reply = await self.exchange(host, relay, DIALBACK_PROTOCOL, {"addrs": asked})
            self.counts["dialback_requests"] += 1
            if isinstance(reply, dict) and reply.get("results"):
                self.counts["dialback_reached"] += 1

    # --- 5: records declaring the victim
    def victim_records(self, attacker: Attacker, seq: int) -> list[bytes]:
        body = {
            "addrs": [self.victim_maddr],
            "data_addrs": [self.victim_maddr],
            "relay_addrs": [self.victim_maddr],
            "role": "trainer",
            "planner_capable": True,
            "version": "0.1.0",
            "hardware": {},
            "compute_gflops": None,
        }
        own = [self.sign(attacker.seed, "peer", seq, body)]
        return own + [self.sign(os.urandom(32), "peer", 1, body) for _ in range(NUM_SYBILS)]

    async def publish(self, attacker: Attacker, topic: str, data: bytes, name: str) -> None:
        try:
            await attacker.pubsub.publish(topic, data)
            self.counts[name] += 1
        except Exception:
            self.counts["publish_failed"] += 1

    # --- 11 and 1: relay capacity, and a circuit reset mid-way
    async def abuse_relays(self, a: Attacker, b: Attacker) -> None:
        for relay in self.victims:
            reply = await self.exchange(a.host, relay, RELAY_PROTOCOL, {"op": "reserve"})
            self.counts["reservations"] += 1
            if not isinstance(reply, dict) or reply.get("error"):
                continue
            selfie = {"op": "connect", "target": a.id, "plane": "control", "endpoint": ""}
            reply = await self.exchange(a.host, relay, RELAY_PROTOCOL, selfie)
            self.counts["self_circuits"] += 1
            self.counts["self_circuits_granted"] += bool(
                isinstance(reply, dict) and reply.get("token")
            )
            tokens: list[bytes] = []
            async with trio.open_nursery() as nursery:  # all at once, as a flood would
                for _ in range(GRANTS_PER_ROUND):
                    nursery.start_soon(self.grant, b, relay, a.id, tokens)
            if tokens and relay in self.relay_of:
                await self.reset_circuit(self.relay_of[relay], tokens[0])

    async def grant(self, source: Attacker, relay: str, target: str, tokens: list[bytes]) -> None:
        """One circuit from `source` to `target` through `relay`; its token kept if granted."""
        request = {"op": "connect", "target": target, "plane": "control", "endpoint": ""}
        reply = await self.exchange(source.host, relay, RELAY_PROTOCOL, request)
        self.counts["grants_asked"] += 1
        if isinstance(reply, dict) and reply.get("token"):
            tokens.append(bytes.fromhex(reply["token"]))
        else:
            self.counts["grants_refused"] += 1

    async def reset_circuit(self, relay: tuple[str, int], token: bytes) -> None:
        """Both halves of a circuit join at the relay port; one writes and resets (RST)."""
        try:
            first = await trio.open_tcp_stream(*relay)
            second = await trio.open_tcp_stream(*relay)
        except OSError:
            self.counts["circuit_failed"] += 1
            return
        try:
            hello = RawHello(RAW_CIRCUIT, token).encode()
            await first.send_all(hello)
            await second.send_all(hello)
            await second.send_all(b"\x00" * 4096)
            with trio.move_on_after(2.0):
                await first.receive_some(4096)
            second.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.counts["circuits_reset"] += 1
        except Exception:
            self.counts["circuit_failed"] += 1
        finally:
            for stream in (second, first):
                with contextlib.suppress(Exception):
                    await stream.aclose()

    # --- 15 (and 11's Sybil slots): identities holding idle streams
    async def sybil(self, seed: bytes) -> None:
        host = make_host(seed)
        async with host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            held: list[INetStream] = []
            for addr in self.addrs:
                with contextlib.suppress(Exception), trio.move_on_after(MESSAGE_TIMEOUT_S):
                    await host.connect(info_from_p2p_addr(Multiaddr(addr)))
            for peer in self.victims:
                reply = await self.exchange(host, peer, RELAY_PROTOCOL, {"op": "reserve"})
                self.counts["sybil_reservations"] += 1
                self.counts["sybil_slots_held"] += bool(
                    isinstance(reply, dict) and not reply.get("error")
                )
                for _ in range(STREAMS_PER_SYBIL):
                    try:
                        with trio.fail_after(MESSAGE_TIMEOUT_S):
                            stream = await host.new_stream(ID.from_base58(peer), [SYNC_PROTOCOL])
                            await stream.write(b"\x00\x00")  # half a length prefix, then nothing
                        held.append(stream)
                        self.counts["idle_streams"] += 1
                    except Exception:
                        self.counts["idle_streams_refused"] += 1
            await trio.sleep(5.0)
            for stream in held:
                with contextlib.suppress(Exception):
                    await stream.reset()


async def attack(args: argparse.Namespace) -> dict[str, Any]:
    doors = Doors(args)
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_member(doors.addrs, args.member[0]))
        b = await stack.enter_async_context(open_member(doors.addrs, args.member[1]))
        stranger = await stack.enter_async_context(open_attacker(doors.addrs))
        garbler = await stack.enter_async_context(open_attacker(doors.addrs))
        sybils = [os.urandom(32) for _ in range(NUM_SYBILS)]
        ids = [a.id, b.id, stranger.id, garbler.id, *map(identity.peer_id_of, sybils)]
        print(json.dumps(ids), flush=True)
        await doors.attempt("find_relays", lambda: doors.find_relays(a))
        for member in (a, b):
            serve_lies(member, doors.counts)
        seq = int(time.time() * 1000)
        deadline = trio.current_time() + args.duration
        while trio.current_time() < deadline:
            for member in (a, b):
                seq += 1
                record = member_record(member, seq, doors.run_id)
                await doors.publish(member, CONTROL_TOPIC, record, "member_records")
                seq += 1
                telemetry = huge_telemetry(member, seq, doors.run_id)
                await doors.publish(member, TELEMETRY_TOPIC, telemetry, "huge_losses")
            for data in doors.victim_records(stranger, seq):
                await doors.publish(stranger, CONTROL_TOPIC, data, "victim_records")
            async with trio.open_nursery() as nursery:
                turns: dict[str, Callable[[], Awaitable[None]]] = {
                    "garbage": lambda: doors.garbage(garbler.host),
                    "idle": doors.idle_connections,
                    "aim": lambda: doors.aim_at_victim(stranger.host, stranger.id),
                    "relays": lambda: doors.abuse_relays(a, b),
                    **{f"sybil{i}": partial(doors.sybil, seed) for i, seed in enumerate(sybils)},
                }
                for name, work in turns.items():
                    nursery.start_soon(doors.attempt, name, work)
            for _ in range(FLOOD_PER_ROUND):  # valid, signed, fresh: only the rate is hostile
                seq += 1
                await doors.publish(
                    b, CONTROL_TOPIC, member_record(b, seq, doors.run_id), "valid_flood"
                )
            doors.counts["rounds"] += 1
    return {"attackers": ids, **doors.counts}


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("addrs", nargs="+", help="control multiaddrs of the nodes (with /p2p/)")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--victim", required=True, help="HOST:PORT no honest node may reach")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--member", action="append", required=True, help="KEY_FILE:TOKEN")
    args = parser.parse_args(argv)
    # ~1,000 sockets at once: our own soft limit up to the hard one
    raise_open_file_limit()
    summary: dict[str, Any] = {}

    async def run() -> None:
        summary.update(await attack(args))

    try:
        run_trio(run)  # less py-libp2p's teardown race, after the attack is over
    except* Exception as group:  # say what failed: the group nests deeper than its printout
        for leaf in _leaves(group):
            traceback.print_exception(leaf)
        raise
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
