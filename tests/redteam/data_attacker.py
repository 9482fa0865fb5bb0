"""A hostile node against a live swarm's data plane, as its own OS process (hivemind's p2pd
client: hivemind is not imported beside libp2p).

    python -m tests.redteam.data_attacker --duration S --run RUN.toml --status STATUS.json

Reads the run spec and a `status --json` of the swarm (the plan and its peers' data
addresses, which every member can see), joins the workers' DHT, and for S seconds:
- floods every worker with frame streams: garbage headers, huge lengths, idle streams;
- asks every worker for a stage state it holds (`--state L0-2:STEP:SHA256`, the digest every
  member can read in the DHT's announcements) as the non-member it is, 12 times at once;
- joins every stage's averaging swarm (its DHT prefix follows from the plan) with a poisoned
  gradient (1e6 everywhere) and a huge weight, round after round.
Its last stdout line is a JSON summary: streams opened and how they were answered, and how
many averaging rounds it got into (`rounds_joined`: must stay 0), how its state requests were
answered (`state_found`: must stay 0), and how many workers' DHTs took it in (`dht_peers`:
must stay 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.p2p import PeerID

from p2ptrain.records import load_run_spec
from p2ptrain.records.status import SwarmStatus
from p2ptrain.train.model import build_stage
from p2ptrain.worker.dht_helpers import swarm_prefix
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.private_tmp import PrivateTmp
from p2ptrain.worker.resume import state_transfer
from p2ptrain.worker.resume.state_request import StateRequest, parse_layers

STREAMS_PER_ROUND = 24
POISON = 1e6


async def flood_frames(dht: DHT, peers: list[str], counts: Counter[str]) -> None:
    """Garbage, oversized and idle frame streams to every worker."""
    p2p = await dht.replicate_p2p()  # a client of the DHT's p2pd, in this process
    payloads = [
        b"",  # idle: never a header
        struct.pack(">I", 2**31 - 1),  # a header length past any bound
        struct.pack(">I", 12) + b"{not json!!}",
        struct.pack(">I", 5) + b"[1e99",
    ]
    kept = []  # idle streams stay open while the round lasts

    async def one(peer: str, payload: bytes) -> None:
        try:
            _, reader, writer = await p2p.call_binary_stream_handler(
                PeerID.from_base58(peer), frames.PROTOCOL
            )
            kept.append(writer)
            if payload:
                writer.write(payload)
                await writer.drain()
            answer = await asyncio.wait_for(reader.read(1), 3.0)
            counts[
                {frames.BUSY: "frames_busy", frames.REJECTED: "frames_rejected"}.get(
                    answer, "frames_other"
                )
            ] += 1
        except TimeoutError:
            counts["frames_held"] += 1
        except Exception:
            counts["frames_failed"] += 1

    await asyncio.gather(
        *(one(p, payloads[i % len(payloads)]) for p in peers for i in range(STREAMS_PER_ROUND))
    )
    for writer in kept:
        writer.close()
    await p2p.shutdown()


STATE_REQUESTS_PER_ROUND = 12  # per worker: past the 2-per-peer and 4-in-all caps


async def ask_for_state(
    dht: DHT, peers: list[str], request: StateRequest, counts: Counter[str]
) -> None:
    """A non-member's stage-state requests: each answered MISSING, BUSY or (never) FOUND."""
    p2p = await dht.replicate_p2p()
    answers = {
        state_transfer.FOUND: "state_found",
        state_transfer.MISSING: "state_missing",
        state_transfer.BUSY: "state_busy",
    }

    async def one(peer: str) -> None:
        try:
            _, reader, writer = await p2p.call_binary_stream_handler(
                PeerID.from_base58(peer), state_transfer.PROTOCOL
            )
            writer.write(request.encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(1), 5.0)
            counts[answers.get(answer, "state_other")] += 1
            counts["state_bytes"] += len(answer) + len(await asyncio.wait_for(reader.read(), 5.0))
            writer.close()
        except Exception:
            counts["state_failed"] += 1

    await asyncio.gather(*(one(p) for p in peers for _ in range(STATE_REQUESTS_PER_ROUND)))
    await p2p.shutdown()


def averaging_intruders(dht: DHT, spec: Any, plan: Any) -> list[DecentralizedAverager]:
    """One averager per stage of the plan, in that stage's swarm, holding a poisoned gradient."""
    intruders = []
    for stage in range(plan.stages):
        num_params = sum(p.numel() for p in build_stage(spec, stage, plan.stages).parameters())
        prefix = swarm_prefix(spec.run_id, stage, plan.epoch, plan.term)
        averager = DecentralizedAverager(
            [torch.full((num_params,), POISON)],
            dht,
            start=True,
            prefix=prefix,
            target_group_size=len(plan.pipelines) + 1,
            min_group_size=2,
            min_matchmaking_time=2.0,
            request_timeout=1.0,
        )
        intruders.append(averager)
    return intruders


async def routing_table_size(_: DHT, node: Any) -> int:
    return len(node.protocol.routing_table.uid_to_peer_id)


def main(argv: list[str] | None = None) -> int:
    PrivateTmp().use()  # hivemind's sockets and multiprocessing's folders go with us
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--status", type=Path, required=True)
    parser.add_argument("--state", help="LAYERS:STEP:SHA256 of a stage state to ask for")
    args = parser.parse_args(argv)
    spec = load_run_spec(args.run)
    status = SwarmStatus.from_dict(json.loads(args.status.read_text()))
    plan = status.plan
    assert plan is not None
    peers = sorted({p for pipeline in plan.pipelines for p in pipeline} | set(plan.spares))
    addrs = [a for p in status.peers if p.id in peers for a in p.data_addrs]
    # the workers' DHTs answer their plan's peers only (worker/dht_gate.py): its bootstrap
    # pings are refused, but p2pd still connects to them, for the streams below
    dht = DHT(
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        initial_peers=addrs,
        ensure_bootstrap_success=False,
    )
    print(dht.peer_id.to_base58(), flush=True)
    counts: Counter[str] = Counter()
    intruders = averaging_intruders(dht, spec, plan)
    state_request = None
    if args.state:
        key, step, digest = args.state.split(":")
        layers = parse_layers(key)
        assert layers is not None, key
        state_request = StateRequest(layers, int(step), digest)
    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline:
        asyncio.run(flood_frames(dht, peers, counts))
        if state_request is not None:
            asyncio.run(ask_for_state(dht, peers, state_request, counts))
        for averager in intruders:
            try:
                gathered = averager.step(weight=1e9, timeout=5.0, allow_retries=False)
            except Exception:
                gathered = None
            counts["rounds_joined" if gathered else "rounds_refused"] += 1
        counts["rounds"] += 1
    counts["dht_peers"] = dht.run_coroutine(routing_table_size)  # workers that took us in
    for averager in intruders:
        averager.shutdown()
    dht.shutdown()
    print(json.dumps({"attacker": dht.peer_id.to_base58(), **counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
