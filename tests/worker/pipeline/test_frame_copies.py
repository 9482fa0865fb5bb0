"""Copies of one frame on a neighbour's streams (worker/pipeline/frame_intake.py: read_frame):
a copy of a frame already filed, or being read on another stream, is answered without its
payload being read. Each copy used to be read and decoded in full (16 streams of one frame:
the frame's size three times over, each) before the duplicate was thrown away. In a
subprocess: the transport imports hivemind, which this process must not (it imports libp2p)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import asyncio, json
import torch
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frames import ACTIVATION, Expected
from p2ptrain.worker.pipeline.frame_intake import FrameIntake
from p2ptrain.worker.traffic import Traffic

PEER = "12D3KooWpeer"
TENSOR = torch.randn(2, 4, 8).half()
HEADER = frames.header_for(TENSOR, ACTIVATION, "run", (1, 0), 5, 1, PEER)
PAYLOAD = bytes(frames.tensor_bytes(frames.encode_payload(TENSOR, "float16", HEADER.scale_exp)))
expect = lambda header: Expected(ACTIVATION, "run", 1, 0, PEER, "float16", (2, 4, 8))
receiver = FrameIntake(expect, Traffic())  # the handler's state only, no p2pd

def stream(data, eof=True):
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader

async def main():
    # the first copy's payload is still arriving: a second copy waits its turn
    first = asyncio.ensure_future(receiver.read_frame(PEER, stream(HEADER.encode(), False)))
    await asyncio.sleep(0.05)
    busy = await receiver.read_frame(PEER, stream(HEADER.encode() + PAYLOAD))
    first.cancel()  # that copy's stream broke: its reading ends
    await asyncio.gather(first, return_exceptions=True)
    filed = await receiver.read_frame(PEER, stream(HEADER.encode() + PAYLOAD))
    third = stream(HEADER.encode() + PAYLOAD)  # the frame is filed: this copy goes unread
    again = await receiver.read_frame(PEER, third)
    return {"busy": busy.hex(), "filed": filed.hex(), "again": again.hex(),
            "unread": len(await third.read()), "payload": len(PAYLOAD),
            "BUSY": frames.BUSY.hex(), "ACCEPTED": frames.ACCEPTED.hex()}

print(json.dumps(asyncio.run(main())))
"""


def test_a_copy_of_a_filed_or_incoming_frame_is_answered_unread() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["busy"] == seen["BUSY"]  # a copy being read elsewhere: the sender retries
    assert seen["filed"] == seen["ACCEPTED"]
    assert seen["again"] == seen["ACCEPTED"] and seen["unread"] == seen["payload"]
