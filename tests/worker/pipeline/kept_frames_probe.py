"""Run by test_kept_frame_streams.py in its own process (`python -m`, from the repository root) (the transport imports hivemind, which
the test process must not): pipeline frames on kept streams (pipe.v4: worker/kept_streams.py,
the Transport's `_send_once`, frame_intake.py's `handle_kept_stream`), over real sockets on
127.0.0.1 standing in for p2pd's. Prints one JSON line: what each scenario saw."""

from __future__ import annotations

import asyncio
import json
import types
from typing import Any

import torch

from p2ptrain.worker import kept_streams
from p2ptrain.worker.pipeline import frame_intake, frames
from p2ptrain.worker.pipeline.frames import ACTIVATION, Expected, FrameHeader, NotReady
from p2ptrain.worker.pipeline.transport import Transport
from tests.worker.socket_net import SocketNet

SENDER, RECEIVER, STRANGER = "12D3KooWsender", "12D3KooWreceiver", "12D3KooWstranger"
RUN, PLAN = "run", (1, 0)
TENSOR = torch.randn(2, 4, 8)


def frame(step: int, sender: str = SENDER) -> tuple[FrameHeader, torch.Tensor]:
    header = frames.header_for(TENSOR, ACTIVATION, RUN, PLAN, step, 0, sender, "float16")
    return header, frames.encode_payload(TENSOR, "float16", header.scale_exp)


def raw(step: int, sender: str = SENDER) -> bytes:
    header, payload = frame(step, sender)
    return header.encode() + bytes(frames.tensor_bytes(payload))


def versions(net: SocketNet) -> list[str]:
    """The version of each stream's protocol opened so far ("v3", "v4")."""
    return [protocol.rsplit(".", 1)[-1] for protocol in net.opened]


def transport(peer: str, net: SocketNet, not_ready_from: int = 1000) -> Transport:
    """A Transport without p2pd: its streams open through `net` as `peer`; it expects a float16
    activation of TENSOR's shape from SENDER for any step under not_ready_from."""

    def expect(header: FrameHeader) -> Expected:
        if header.step >= not_ready_from:
            raise NotReady()
        return Expected(ACTIVATION, RUN, *PLAN, SENDER, "float16", tuple(TENSOR.shape))

    p2p = types.SimpleNamespace(peer_id=types.SimpleNamespace(to_base58=lambda: peer))
    made = Transport(asyncio.get_running_loop(), p2p, expect)  # type: ignore[arg-type]
    made.open_stream = lambda peer_id, protocol: net.open(peer, protocol)  # type: ignore[method-assign]
    made.intake.plan_peers = frozenset({SENDER, RECEIVER})
    return made


def pair(v4: bool = True, not_ready_from: int = 1000) -> tuple[Transport, Transport, SocketNet]:
    net = SocketNet()
    receiver = transport(RECEIVER, net, not_ready_from)
    net.handlers[frames.PROTOCOL] = receiver.intake.handle_stream
    if v4:
        net.handlers[frames.STREAM_PROTOCOL] = receiver.intake.handle_kept_stream
    return transport(SENDER, net), receiver, net


async def send_all(sender: Transport, steps: range) -> list[str]:
    return [(await sender._send_once(RECEIVER, *frame(step))).hex() for step in steps]


async def raw_stream(
    receiver: Transport, peer: str, data: bytes, wait_s: float = 5.0, then_close: bool = False
) -> dict:
    """`data` on one v4 stream of `peer` (`then_close`: our side closed after it, as a sender
    does once it has its answers, so the receiver need not wait out its linger): every answer
    byte, and whether the receiver ended it."""
    net = SocketNet()
    net.handlers[frames.STREAM_PROTOCOL] = receiver.intake.handle_kept_stream
    reader, writer = await net.open(peer, frames.STREAM_PROTOCOL)
    writer.write(data)
    if then_close:
        writer.write_eof()
    answers, ended = b"", False
    try:
        async with asyncio.timeout(wait_s):
            while byte := await reader.read(1):
                answers += byte
            ended = True
    except TimeoutError:
        pass
    writer.close()
    return {"answers": answers.hex(), "ended": ended}


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {"frame_bytes": len(raw(0))}
    # ten frames one after another: one stream, every one filed
    sender, receiver, net = pair()
    seen["ten"] = await send_all(sender, range(10))
    seen["ten_opened"] = versions(net)
    seen["ten_filed"] = sum(receiver.inbox.holds(frame(step)[0]) for step in range(10))
    seen["ten_received"] = receiver.traffic.bytes_received
    # a copy of a filed frame: accepted, its payload read and dropped, and the stream goes on
    seen["copy"] = await send_all(sender, range(9, 11))
    seen["copy_opened"] = versions(net)
    # four at once: as many streams, each kept (up to MAX_IDLE_FRAME_STREAMS) for the next
    sender, receiver, net = pair()
    steps = range(20, 24)
    answers = await asyncio.gather(*(sender._send_once(RECEIVER, *frame(s)) for s in steps))
    seen["four"] = [answer.hex() for answer in answers]
    seen["four_idle"] = sender._idle.count(RECEIVER)
    seen["four_then_opened"] = len(net.opened)
    await asyncio.gather(*(sender._send_once(RECEIVER, *frame(s)) for s in range(30, 34)))
    seen["four_again_opened"] = len(net.opened)
    # a frame the receiver is not ready for: BUSY unread, the stream ends, the next opens anew
    sender, receiver, net = pair(not_ready_from=5)
    seen["busy"] = await send_all(sender, range(4, 7))
    seen["busy_opened"] = versions(net)
    # a neighbour of the last version: one frame a stream on pipe.v3
    sender, receiver, net = pair(v4=False)
    seen["v3"] = await send_all(sender, range(3))
    seen["v3_opened"] = versions(net)
    seen["v3_filed"] = sum(receiver.inbox.holds(frame(step)[0]) for step in range(3))
    # a stranger's stream: BUSY, nothing read
    _, receiver, _ = pair()
    seen["stranger"] = await raw_stream(receiver, STRANGER, b"")
    seen["stranger_received"] = receiver.traffic.bytes_received
    # a bad frame after good ones: REJECTED, the stream ends
    _, receiver, _ = pair()
    bad = frames.HEADER_LEN.pack(5) + b"[[[[["
    seen["bad"] = await raw_stream(receiver, SENDER, raw(0) + raw(1) + bad, then_close=True)
    # a frame claiming another sender on the stream: REJECTED unread
    _, receiver, _ = pair()
    # (our side left open: the receiver ends the stream itself, after its linger)
    seen["spoofed"] = await raw_stream(receiver, SENDER, raw(0) + raw(1, STRANGER), wait_s=8.0)
    # the sender left the plan after its first frame: the stream ends after that answer
    _, receiver, _ = pair()
    net = SocketNet()
    net.handlers[frames.STREAM_PROTOCOL] = receiver.intake.handle_kept_stream
    reader, writer = await net.open(SENDER, frames.STREAM_PROTOCOL)
    writer.write(raw(0))
    first = await reader.readexactly(1)
    receiver.intake.plan_peers = frozenset({RECEIVER})
    writer.write(raw(1))
    writer.write_eof()
    rest = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    seen["left"] = (first + rest).hex()
    # an idle stream: closed after IDLE_S (shortened here) without a rejection, its place freed
    _, receiver, _ = pair()
    frame_intake.HEADER_TIMEOUT_S = 0.3
    kept_streams.IDLE_S = 0.3
    seen["idle"] = await raw_stream(receiver, SENDER, raw(0), wait_s=5.0)
    seen["idle_streams_left"] = receiver.intake._streams.of(SENDER)
    seen["codes"] = {
        "ACCEPTED": frames.ACCEPTED.hex(),
        "REJECTED": frames.REJECTED.hex(),
        "BUSY": frames.BUSY.hex(),
    }
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
