"""What the frame handler (worker/pipeline/frame_intake.py: read_frame) raises for a frame it
refuses: the one wire error (a BAD_INPUT, answered REJECTED), and a gradient held to the bound
Expected carries (MAX_ABS_VALUE x the run's loss_scale). In a subprocess: the transport imports
hivemind, which this process must not (it imports libp2p)."""

from __future__ import annotations

import json
import subprocess
import sys

from p2ptrain.errors import WireError
from p2ptrain.worker.inbound import BAD_INPUT

PROBE = """
import asyncio, json
import torch
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frames import GRADIENT, Expected
from p2ptrain.worker.pipeline.frame_intake import FrameIntake
from p2ptrain.worker.traffic import Traffic

PEER, OTHER = "12D3KooWpeer", "12D3KooWother"
GRAD = torch.full((2, 4, 8), 4.1e4)  # honest at loss_scale 2**24
receiver = FrameIntake(lambda header: Expected(
    GRADIENT, "run", 1, 0, PEER, "float32", (2, 4, 8), frames.max_abs_of(GRADIENT, 2.0**24)
), Traffic())  # the handler's state only, no p2pd

def frame(sender):
    header = frames.header_for(GRAD, GRADIENT, "run", (1, 0), 5, 1, sender)
    reader = asyncio.StreamReader()
    reader.feed_data(header.encode() + bytes(frames.tensor_bytes(GRAD)))
    reader.feed_eof()
    return reader

async def main():
    try:
        await receiver.read_frame(PEER, frame(OTHER))  # claims another sender
        refused = "nothing"
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    answer = await receiver.read_frame(PEER, frame(PEER))
    return {"refused": refused, "answer": answer.hex(), "ACCEPTED": frames.ACCEPTED.hex()}

print(json.dumps(asyncio.run(main())))
"""


def test_refused_frames_raise_the_wire_error_and_gradients_get_the_loss_scale() -> None:
    assert issubclass(WireError, BAD_INPUT)  # what FRAMING.answer refuses with REJECTED
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["refused"].startswith("WireError: malformed frame: sender"), seen["refused"]
    assert seen["answer"] == seen["ACCEPTED"]
