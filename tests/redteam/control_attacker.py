"""A hostile node against a live swarm's control plane, as its own OS process.

    python -m tests.redteam.control_attacker --duration S ADDR [ADDR ...]

Connects to every ADDR (the bootstrap's and the nodes' control addresses), prints its peer ids
(a JSON list: one identity per family of attacks, one for the request flood),
then for S seconds repeats every control-plane attack of docs/security.md: hostile bytes
(unsigned, forged, deep nesting, huge integers, NaN), records with garbage addresses, forged
tokens, a throwaway-identity flood, term claims without authority and with a huge term, plans the
run cannot take, floods of sync and status requests, and streams opened and left hanging. Its
last stdout line is a JSON summary: how many of each attack went out, and how many of our own
calls failed (a victim that banned us or closed the stream counts there; that is not an error).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control.gossip import CONTROL_TOPIC, TELEMETRY_TOPIC
from p2ptrain.control.rpcs import RUN_PROTOCOL, STATUS_PROTOCOL
from p2ptrain.control.sync import SYNC_PROTOCOL
from p2ptrain.net import rpc
from p2ptrain.net.host import run_trio
from p2ptrain.records import issue_token
from tests.control.attacker import Attacker, open_attacker

SYBILS_PER_ROUND = 16
CONCURRENT_CALLS = 24  # requests in flight at once to each victim, per round
HANGING_STREAMS = 8  # streams per victim per round opened and never finished
ROUND_PAUSE_S = 0.5


def hostile_bytes(attacker: Attacker) -> list[bytes]:
    """Messages that once killed a node: each must come back as the one wire error."""
    unsigned = json.loads(attacker.record())
    del unsigned["sig"]
    forged = json.loads(attacker.record())
    forged["author"] = identity.peer_id_of(os.urandom(32))
    huge_ts = attacker.record().replace(b'"ts":', b'"ts":1' + b"0" * 400 + b',"x":', 1)
    return [
        b"[" * 60_000,
        b"{not json",
        b"\x00\xff" * 100,
        huge_ts,
        attacker.envelope("claim", {"term": 1}).replace(b'"term":1', b'"term":NaN'),
        json.dumps(unsigned).encode(),
        json.dumps(forged).encode(),
        b"{" + b" " * 70_000 + b"}",
    ]


def lying_records(attacker: Attacker, victims: list[str]) -> list[bytes]:
    """Well-signed records that must be refused or ignored: garbage addresses, a token the
    attacker signed itself, another peer's token, a worker record without any token."""
    self_signed = issue_token(attacker.seed, attacker.id, True, time.time() + 3600).encode()
    someone_elses = issue_token(attacker.seed, victims[0], True, time.time() + 3600).encode()
    trainer: dict[str, Any] = {"role": "trainer", "data_addrs": ["/ip4/127.0.0.1/tcp/9"]}
    return [
        attacker.record(**trainer),
        attacker.record(token=self_signed, **trainer),
        attacker.record(token=someone_elses, **trainer),
        attacker.record(addrs=["garbage"]),
        attacker.record(data_addrs=["/ip4/999.1.1.1/tcp/1"], role="trainer"),
    ]


def authority_grabs(attacker: Attacker, victims: list[str]) -> list[bytes]:
    """Claims and plans from a peer the organiser never authorised."""
    plans = [
        {"pipelines": [], "stages": 99},
        {"pipelines": [[attacker.id]], "stages": 1},
        {"pipelines": [[attacker.id, victims[0]]], "stages": 2},
    ]
    out = [attacker.envelope("claim", {"term": term}) for term in (1, 2, 2**53, 10**18)]
    for term in (1, 2, 10**18):
        for shape in plans:
            addrs = {peer: ["/ip4/127.0.0.1/tcp/9"] for peer in [attacker.id, *victims]}
            body = {
                "term": term,
                "epoch": 1,
                "planner": attacker.id,
                "spares": [],
                "data_addrs": addrs,
                "cost_s": 0.1,
                **shape,
            }
            out.append(attacker.envelope("plan", body))
    return out


async def flood_requests(attacker: Attacker, victims: list[str], counts: Counter[str]) -> None:
    """Many sync/status/run requests at once, and streams opened and left hanging."""

    async def one_call(peer: str, protocol: Any, request: bytes) -> None:
        try:
            await rpc.call(attacker.host, ID.from_base58(peer), protocol, request)
            counts["calls_answered"] += 1
        except Exception:
            counts["calls_failed"] += 1

    async def hang(peer: str, protocol: Any) -> None:
        try:
            stream = await attacker.host.new_stream(ID.from_base58(peer), [protocol])
            await stream.write(b"\x7f\xff\xff\xff")  # a length prefix, then nothing
            counts["hanging_streams"] += 1
            await trio.sleep(5)
            await stream.reset()
        except Exception:
            counts["calls_failed"] += 1

    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            for peer in victims:
                for i in range(CONCURRENT_CALLS):
                    protocol = (SYNC_PROTOCOL, STATUS_PROTOCOL, RUN_PROTOCOL)[i % 3]
                    request = b"" if i % 2 else b"\xff" * 1000
                    nursery.start_soon(one_call, peer, protocol, request)
                for i in range(HANGING_STREAMS):
                    nursery.start_soon(hang, peer, (SYNC_PROTOCOL, STATUS_PROTOCOL)[i % 2])


async def attack(addrs: list[str], duration_s: float) -> dict[str, Any]:
    """Each family of attacks from its own identity (identities are free), so that a victim
    blocking one for its first bad message still gets to judge the others."""
    victims = [str(info_from_p2p_addr(Multiaddr(a)).peer_id) for a in addrs]
    counts: Counter[str] = Counter()
    families: dict[str, Callable[[Attacker], list[bytes]]] = {
        "hostile_bytes": hostile_bytes,
        "lying_records": lambda a: lying_records(a, victims),
        "authority_grabs": lambda a: authority_grabs(a, victims),
        "sybil_records": lambda a: [a.record(seed=os.urandom(32)) for _ in range(SYBILS_PER_ROUND)],
    }
    async with contextlib.AsyncExitStack() as stack:
        attackers = [await stack.enter_async_context(open_attacker(addrs)) for _ in families]
        flooder = await stack.enter_async_context(open_attacker(addrs))
        ids = [a.id for a in [*attackers, flooder]]
        print(json.dumps(ids), flush=True)
        deadline = trio.current_time() + duration_s
        while trio.current_time() < deadline:
            for attacker, (name, make) in zip(attackers, families.items(), strict=True):
                for i, data in enumerate(make(attacker)):
                    # hostile bytes on both topics; signed messages on the control topic only
                    # (the same envelope on both would be judged a replay, not what it is)
                    topic = TELEMETRY_TOPIC if name == "hostile_bytes" and i % 2 else CONTROL_TOPIC
                    try:
                        await attacker.pubsub.publish(topic, data)
                        counts[name] += 1
                    except Exception:
                        counts["publish_failed"] += 1
                await trio.sleep(0.05)
            await flood_requests(flooder, victims, counts)
            counts["rounds"] += 1
            await trio.sleep(ROUND_PAUSE_S)
    return {"attackers": ids, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("addrs", nargs="+", help="control multiaddrs of the victims (with /p2p/)")
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args(argv)
    summary: dict[str, Any] = {}

    async def run() -> None:
        summary.update(await attack(args.addrs, args.duration))

    run_trio(run)  # less py-libp2p's teardown race, after the attack is over
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
