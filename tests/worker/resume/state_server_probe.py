"""Run by test_state_server_caps.py in its own process (hivemind is not imported beside libp2p):
five hivemind DHT peers on 127.0.0.1, each with the worker's Transport; the victim serves its
stage states (worker/resume/state_transfer.py) under plans that name three members. The members and a
stranger ask for them, idle or at once; prints one JSON line with what each got.

    python state_server_probe.py DIRECTORY
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hivemind import DHT
from hivemind.p2p import PeerID

from p2ptrain.records import Plan, RunSpec
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import stamped_path
from p2ptrain.train.checkpoint_read import PICKLED_OPTIMIZER_FORMAT
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_bounds import expected_state_bytes
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.pipeline.frames import FrameHeader, NotReady
from p2ptrain.worker.pipeline.transport import Transport
from p2ptrain.worker.private_tmp import PrivateTmp
from p2ptrain.worker.resume import state_transfer
from p2ptrain.worker.resume.state_fetch import fetch_state, tell_held
from p2ptrain.worker.resume.state_request import StateRequest
from p2ptrain.worker.resume.state_transfer import StateServer

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10)
LAYERS = range(0, 1)
ANSWERS = {
    state_transfer.FOUND: "found",
    state_transfer.MISSING: "missing",
    state_transfer.BUSY: "busy",
    b"": "eof",
}
KEPT: dict[str, list[asyncio.StreamWriter]] = {}  # a writer that is collected closes its stream


def never_ready(header: FrameHeader) -> None:
    raise NotReady()


async def ask(transport: Transport, victim: str, request: bytes, wait_s: float) -> str:
    """Open a stage-state stream to the victim, send `request` (b"": nothing, the stream idles)
    and return the first answer byte, or "held" if none came within wait_s."""
    _, reader, writer = await transport.p2p.call_binary_stream_handler(
        PeerID.from_base58(victim), state_transfer.PROTOCOL
    )
    KEPT.setdefault(transport.peer_id, []).append(writer)
    if request:
        writer.write(request)
        await writer.drain()
    try:
        return ANSWERS.get(await asyncio.wait_for(reader.read(1), wait_s), "other")
    except TimeoutError:
        return "held"


async def ask_in_turn(transport: Transport, victim: str, count: int, wait_s: float) -> list[str]:
    """`count` idle streams, opened one by one (each counted before the next opens)."""
    tasks = []
    for _ in range(count):
        tasks.append(asyncio.ensure_future(ask(transport, victim, b"", wait_s)))
        await asyncio.sleep(0.3)
    return list(await asyncio.gather(*tasks))


async def close_kept(peer_id: str) -> None:
    for writer in KEPT.pop(peer_id, []):
        writer.close()
    await asyncio.sleep(1.0)  # the server sees the ends and frees the slots


async def start_closing_later(peer_id: str, delay_s: float) -> None:
    """Close the peer's kept streams `delay_s` from now (on its loop), without waiting."""
    asyncio.get_running_loop().call_later(
        delay_s, lambda: asyncio.ensure_future(close_kept(peer_id))
    )


def fetch(transport: Transport, victim: str, directory: Path, digest: str, step: int) -> str:
    try:
        path = fetch_state(
            transport,
            victim,
            LAYERS,
            step,
            directory,
            digest,
            expected_state_bytes(SPEC, LAYERS),
            None,
        )
        return file_sha256(path)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:200]


def main() -> None:
    PrivateTmp().use()  # hivemind's sockets and multiprocessing's folders go with us
    directory = Path(sys.argv[1])
    dhts: list[DHT] = []
    for _ in range(5):
        known = [str(a) for d in dhts for a in d.get_visible_maddrs()]
        dhts.append(DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=known))
    peers = [Transport.start(d.replicate_p2p, never_ready) for d in dhts]
    victim, m1, m2, m3, stranger = peers
    ids = [t.peer_id for t in peers]

    # the victim's states: one of format /3, one of the pickled format /2 (a benign one)
    held = directory / "victim"
    model = build_stage(SPEC, 0, 2)
    optimizer = make_optimizer(model, SPEC)
    record_step(held, SPEC, model, StageSnapshot.take(model, optimizer, 2))
    digest = file_sha256(stamped_path(held, LAYERS, 2))
    legacy = stamped_path(held, LAYERS, 1)
    torch.save(
        {
            "format": PICKLED_OPTIMIZER_FORMAT,
            "run_id": SPEC.run_id,
            "optimizer_state": optimizer.state_dict(),
        },
        legacy,
    )
    legacy_digest = file_sha256(legacy)

    server = StateServer(victim)

    def plan(epoch: int, members: list[str]) -> Plan:
        return Plan(1, epoch, ids[0], 1, tuple((p,) for p in members), (), {}, 1.0)

    server.serve_run(SPEC, held, plan(1, ids[:4]))
    request = StateRequest(LAYERS, 2, digest).encode()
    result: dict[str, Any] = {
        "per_peer": state_transfer.MAX_PENDING_PER_PEER,
        "digest": digest,
    }
    call: Callable[..., Any] = lambda t, coroutine: t.call(coroutine, timeout_s=60)  # noqa: E731

    # a stranger who knows the digest gets nothing, however often it asks
    result["stranger"] = [call(stranger, ask(stranger, ids[0], request, 5.0)) for _ in range(3)]
    # a member holds two idle streams: its third is busy; a second member holds two more (all
    # 4 serving slots, before streams waited for their request apart): a third member's
    # request is served all the same
    result["m1_idle"] = call(m1, ask_in_turn(m1, ids[0], 3, 2.0))
    result["m2_idle"] = call(m2, ask_in_turn(m2, ids[0], 2, 2.0))
    result["m3_fetch"] = fetch(m3, ids[0], directory / "m3", digest, 2)
    result["refused"] = server.num_refused
    # the same state again, under the same plan: a full upload each, refused
    result["m3_fetch_again"] = fetch(m3, ids[0], directory / "m3again", digest, 2)
    call(m1, close_kept(ids[1]))
    call(m2, close_kept(ids[2]))
    # the pickled state is not served
    result["m3_fetch_pickled"] = fetch(m3, ids[0], directory / "m3", legacy_digest, 1)
    # a member told busy (its two idle streams) retries until they close (2 s later)
    call(m1, ask_in_turn(m1, ids[0], 2, 0.5))
    m1.call(start_closing_later(ids[1], 2.0))
    started = time.monotonic()
    result["m1_fetch_after_busy"] = fetch(m1, ids[0], directory / "m1", digest, 2)
    result["m1_fetch_after_busy_s"] = time.monotonic() - started
    # a member that holds the state says so: a donor's hand-over stops waiting for it; a
    # stranger's word is not heard
    tell_held(m2, ids[0], [(LAYERS, 2, digest)])
    result["m2_told"] = server.served.wait_for({(ids[2], digest)}, 5.0, lambda: False)
    with contextlib.suppress(Exception):
        tell_held(stranger, ids[0], [(LAYERS, 2, digest)])
    result["stranger_told"] = server.served.wait_for({(ids[4], digest)}, 0.5, lambda: False)
    # plans move on: a peer of the previous plan is still served, not one of the plan before
    server.serve_run(SPEC, held, plan(2, [ids[0], ids[2]]))
    result["m1_previous_plan"] = fetch(m1, ids[0], directory / "m1b", digest, 2)
    server.serve_run(SPEC, held, plan(3, [ids[0], ids[2]]))
    result["m1_two_plans_ago"] = fetch(m1, ids[0], directory / "m1c", digest, 2)
    result["m2_current_plan"] = fetch(m2, ids[0], directory / "m2", digest, 2)
    print(json.dumps(result))
    for t in peers:
        t.close()
    for d in dhts:
        d.shutdown()


if __name__ == "__main__":
    main()
