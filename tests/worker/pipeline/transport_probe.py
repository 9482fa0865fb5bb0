"""Run by test_transport_caps.py in its own process (hivemind is not imported beside libp2p):
three hivemind DHT peers on 127.0.0.1, each with the worker's Transport; the victim's plan names
one neighbour. The neighbour floods the victim with idle frame streams and a stranger with any
streams at all; then the neighbour sends frames to the third peer, whose plan names it, two
micro-batches a step at once, as a stage does. Prints one JSON line with the answers each got,
the streams the frames took and what the third peer filed."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import torch
from hivemind import DHT
from hivemind.p2p import PeerID

from p2ptrain.worker.pipeline import frame_intake, frames
from p2ptrain.worker.pipeline.frame_intake import MAX_INBOUND_PER_PEER
from p2ptrain.worker.pipeline.frames import ACTIVATION, Expected, FrameHeader, NotReady
from p2ptrain.worker.pipeline.transport import Transport
from p2ptrain.worker.private_tmp import PrivateTmp

FLOOD = MAX_INBOUND_PER_PEER + 8
# the transport's 10 s, shortened: what is tested is that the held streams go once it is past
# (and are held until then: the neighbour's first look comes 2 s after its flood)
HEADER_TIMEOUT_S = 5.0


TENSOR = torch.randn(2, 4, 8)
ROLES: dict[str, str] = {}  # "neighbour": its peer id, once started


def never_ready(header: FrameHeader) -> None:
    raise NotReady()


def from_the_neighbour(header: FrameHeader) -> Expected:
    if header.sender != ROLES.get("neighbour"):
        raise NotReady()
    return Expected(ACTIVATION, "run", 1, 0, header.sender, "float16", tuple(TENSOR.shape))


def send_frames(sender: Transport, receiver: str, steps: int) -> list[str]:
    """Two micro-batches a step, at once, each step after the last one's were accepted; the
    protocols of the streams they opened."""
    opened: list[str] = []
    open_stream = sender.open_stream

    async def counted(peer_id: str, protocol: str) -> Any:
        opened.append(protocol)
        return await open_stream(peer_id, protocol)

    sender.open_stream = counted  # type: ignore[method-assign]
    for step in range(steps):
        sends = [
            sender.send(receiver, TENSOR, ACTIVATION, "run", (1, 0), step, micro, wire="float16")
            for micro in range(2)
        ]
        for sent in sends:
            sent.result(timeout=30)
    return opened


KEPT: list[asyncio.StreamWriter] = []  # a writer that is collected closes its stream


async def open_idle(transport: Transport, victim: str) -> asyncio.StreamReader:
    """A frame stream to the victim that never sends a byte."""
    _, reader, writer = await transport.p2p.call_binary_stream_handler(
        PeerID.from_base58(victim), frames.PROTOCOL
    )
    KEPT.append(writer)
    return reader


async def answers(readers: list[asyncio.StreamReader], wait_s: float) -> list[str]:
    async def one(reader: asyncio.StreamReader) -> str:
        try:
            return {
                frames.ACCEPTED: "accepted",
                frames.REJECTED: "rejected",
                frames.BUSY: "busy",
            }.get(await asyncio.wait_for(reader.read(1), wait_s), "eof")
        except TimeoutError:
            return "held"

    return list(await asyncio.gather(*(one(r) for r in readers)))


async def flood(transport: Transport, victim: str, count: int) -> list[asyncio.StreamReader]:
    readers = []
    for _ in range(count):  # one by one: each is counted before the next one opens
        readers.append(await open_idle(transport, victim))
        await asyncio.sleep(0.02)
    return readers


def main() -> None:
    PrivateTmp().use()  # hivemind's sockets and multiprocessing's folders go with us
    frame_intake.HEADER_TIMEOUT_S = HEADER_TIMEOUT_S
    dhts: list[DHT] = []
    for _ in range(3):
        known = [str(a) for d in dhts for a in d.get_visible_maddrs()]
        dhts.append(DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=known))
    victim, neighbour = (Transport.start(d.replicate_p2p, never_ready) for d in dhts[:2])
    stranger = Transport.start(dhts[2].replicate_p2p, from_the_neighbour)
    ROLES["neighbour"] = neighbour.peer_id
    victim.connect_all({neighbour.peer_id: [str(a) for a in dhts[1].get_visible_maddrs()]})
    result: dict[str, Any] = {
        "max_inbound_per_peer": MAX_INBOUND_PER_PEER,
        "header_timeout_s": HEADER_TIMEOUT_S,
    }
    held = neighbour.call(flood(neighbour, victim.peer_id, FLOOD))
    result["neighbour"] = neighbour.call(answers(held, 2.0))
    strangers = stranger.call(flood(stranger, victim.peer_id, FLOOD))
    result["stranger"] = stranger.call(answers(strangers, 5.0))
    started = time.monotonic()
    result["neighbour_later"] = neighbour.call(answers(held, HEADER_TIMEOUT_S + 10), 60)
    result["released_after_s"] = time.monotonic() - started
    result["refused_counted"] = victim.num_streams_refused
    stranger.intake.plan_peers = frozenset({neighbour.peer_id})
    neighbour.connect_all({stranger.peer_id: [str(a) for a in dhts[2].get_visible_maddrs()]})
    result["frames_opened"] = send_frames(neighbour, stranger.peer_id, 8)
    result["frames_filed"] = len(stranger.inbox)
    result["stream_protocols"] = [frames.PROTOCOL, frames.STREAM_PROTOCOL]
    print(json.dumps(result))
    for t in (victim, neighbour, stranger):
        t.close()
    for d in dhts:
        d.shutdown()


if __name__ == "__main__":
    main()
