"""A member that resets the connections a NATed node takes through its relay (issue 26, 1), as
its own OS process in a testbed namespace.

    python -m tests.redteam.nat_attacker --duration S --run-id RUN --bootstrap ADDR
        --relay HOST:PORT --target PEER --victim HOST:PORT --listen OWN_IP

Joins the bootstrap as a member (an open run: a record makes one; its role, `observer`, is no
role a plan places), prints its peer id (a JSON list), then for S seconds asks the bootstrap's
relay, in rounds: for a punch to TARGET from an endpoint the relay observed for us, accepts the
punched connection and resets it mid-hello; for a relayed circuit to TARGET, joins it and
resets it mid-way; for a punch to the VICTIM's endpoint (which the relay never observed for us).
Its last stdout line is a JSON summary of what went out and what came back.
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
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2ptrain.control import wire
from p2ptrain.control.gossip import CONTROL_TOPIC
from p2ptrain.control.relay_service import RELAY_PROTOCOL
from p2ptrain.net.framing import read_frame, write_frame
from p2ptrain.net.host import make_host, run_trio
from p2ptrain.records.relay import RAW_CIRCUIT
from p2ptrain.traversal import relay
from tests.control.attacker import Attacker

ACCEPT_TIMEOUT_S = 8.0  # the target punches within the relay's signalling
ROUND_PAUSE_S = 2.0


@contextlib.asynccontextmanager
async def open_member(bootstrap: str, listen_ip: str) -> AsyncIterator[Attacker]:
    """A py-libp2p peer on our testbed address (tests/control/attacker.py's listens on
    loopback, which the dial gate of a host on loopback only keeps from dialling a testbed
    peer), with GossipSub to publish its record, connected to the bootstrap."""
    seed = os.urandom(32)
    host = make_host(seed)
    gossipsub = GossipSub(
        protocols=[PROTOCOL_ID_V11], degree=4, degree_low=3, degree_high=8, heartbeat_interval=1
    )
    pubsub = Pubsub(host, gossipsub)
    async with (
        host.run(listen_addrs=[Multiaddr(f"/ip4/{listen_ip}/tcp/0")]),
        background_trio_service(pubsub),
        background_trio_service(gossipsub),
    ):
        await pubsub.wait_until_ready()
        await host.connect(info_from_p2p_addr(Multiaddr(bootstrap)))
        yield Attacker(seed, pubsub, host)


def reset(sock: trio.socket.SocketType) -> None:
    """Close with an RST: what a far end that vanishes mid-exchange looks like."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def ask(attacker: Attacker, relay_id: str, request: dict[str, Any]) -> dict[str, Any]:
    """One relay request; {} if the relay closed or refused the stream."""
    with trio.move_on_after(15), contextlib.suppress(Exception):
        stream = await attacker.host.new_stream(ID.from_base58(relay_id), [RELAY_PROTOCOL])
        try:
            await write_frame(stream, json.dumps(request).encode())
            reply = json.loads(await read_frame(stream, 4096))
            return reply if isinstance(reply, dict) else {}
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
    return {}


async def punched_reset(attacker: Attacker, args: argparse.Namespace, counts: Counter[str]) -> None:
    """Ask for a punch from an endpoint the relay observed, accept it, reset it mid-hello."""
    raw = relay.split_endpoint(args.relay)
    seen = await relay.observe_from(raw)
    listener = await relay.bound_socket(seen.port)
    listener.listen(4)
    try:
        request = {
            "op": "connect",
            "target": args.target,
            "plane": "control",
            "endpoint": seen.endpoint,
        }
        reply = await ask(attacker, args.relay_id, request)
        counts["punch_requests"] += 1
        if reply.get("error") or not reply.get("token"):
            counts["punches_refused"] += 1
            print(f"punch refused: {reply}", file=sys.stderr, flush=True)
            return
        with trio.move_on_after(ACCEPT_TIMEOUT_S):
            conn, _ = await listener.accept()
            await conn.send(b"\x03abc")  # the start of a punched hello, then a reset
            reset(conn)
            counts["punched_resets"] += 1
    finally:
        listener.close()


async def relayed_reset(attacker: Attacker, args: argparse.Namespace, counts: Counter[str]) -> None:
    """Ask for a relayed circuit, join it, write a little and reset it."""
    request = {"op": "connect", "target": args.target, "plane": "control", "endpoint": ""}
    reply = await ask(attacker, args.relay_id, request)
    counts["relay_requests"] += 1
    if reply.get("error") or not reply.get("token"):
        counts["relays_refused"] += 1
        return
    stream = await relay.open_raw(
        relay.split_endpoint(args.relay), RAW_CIRCUIT, bytes.fromhex(reply["token"])
    )
    await stream.send_all(os.urandom(100))
    await trio.sleep(0.2)
    reset(stream.socket)
    counts["relayed_resets"] += 1


async def attack(args: argparse.Namespace) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    async with open_member(args.bootstrap, args.listen) as attacker:
        args.relay_id = str(info_from_p2p_addr(Multiaddr(args.bootstrap)).peer_id)
        body = {
            "addrs": [],
            "data_addrs": [],
            "role": "observer",
            "planner_capable": False,
            "version": "0.1.0",
            "hardware": {},
            "compute_gflops": None,
        }
        seq = int(time.time() * 1000)
        print(json.dumps([attacker.id]), flush=True)
        deadline = trio.current_time() + args.duration
        while trio.current_time() < deadline:
            seq += 1  # our record, so that the relay counts us a member
            await attacker.pubsub.publish(
                CONTROL_TOPIC, wire.sign(attacker.seed, "peer", seq, body, run_id=args.run_id)
            )
            at_victim = {
                "op": "connect",
                "target": args.target,
                "plane": "control",
                "endpoint": args.victim,
            }
            reply = await ask(attacker, args.relay_id, at_victim)
            counts["victim_punches"] += 1
            counts["victim_punches_granted"] += bool(reply.get("token"))
            for family in (punched_reset, relayed_reset):
                try:
                    await family(attacker, args, counts)
                except Exception as exc:  # ours failed: counted, the rounds go on
                    counts[f"{family.__name__}_failed"] += 1
                    print(f"{family.__name__}: {exc!r}", file=sys.stderr, flush=True)
            counts["rounds"] += 1
            await trio.sleep(ROUND_PAUSE_S)
    return {"attacker": attacker.id, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--bootstrap", required=True, help="its control multiaddr (with /p2p/)")
    parser.add_argument("--relay", required=True, help="its relay port, HOST:PORT")
    parser.add_argument("--target", required=True, help="the NATed node's peer id")
    parser.add_argument("--victim", required=True, help="HOST:PORT no honest node may reach")
    parser.add_argument("--listen", required=True, help="our own testbed address")
    args = parser.parse_args(argv)
    summary: dict[str, Any] = {}

    async def run() -> None:
        summary.update(await attack(args))

    run_trio(run)  # less py-libp2p's teardown race, after the attack is over
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
