"""Length-prefixed frames on a libp2p stream, with a size cap and exact reads; every byte our
control-plane protocols (RPCs, sync, probes) move goes through here and is counted."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from libp2p.abc import INetStream
from libp2p.network.stream.exceptions import StreamEOF, StreamReset

_LENGTH = struct.Struct(">I")


@dataclass
class ByteCounter:
    """Application bytes of this process's own protocols, cumulative (gossip and the DHT are
    py-libp2p's and not counted)."""

    sent: int = 0
    received: int = 0


TRAFFIC = ByteCounter()  # one per process: the control plane is one process


class FrameError(ValueError):
    """The peer sent a frame we refuse (too large) or closed the stream mid-frame."""


class FrameTooLarge(FrameError):
    """The peer announced a frame larger than we read: its fault, not the network's."""


async def read_exact(stream: INetStream, num_bytes: int) -> bytes:
    """Read exactly num_bytes (stream.read returns *up to* n bytes)."""
    chunks = []
    remaining = num_bytes
    while remaining:
        try:
            chunk = await stream.read(min(remaining, 1 << 20))
        except (StreamEOF, StreamReset):
            chunk = b""
        if not chunk:
            raise FrameError(f"stream closed with {remaining} of {num_bytes} bytes missing")
        TRAFFIC.received += len(chunk)
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


async def send(stream: INetStream, data: bytes) -> None:
    """Write data, counted."""
    await stream.write(data)
    TRAFFIC.sent += len(data)


async def read_some(stream: INetStream, max_bytes: int) -> bytes:
    """Read up to max_bytes (b"" at the end of the stream), counted."""
    chunk = await stream.read(max_bytes)
    TRAFFIC.received += len(chunk)
    return chunk


async def write_frame(stream: INetStream, payload: bytes) -> None:
    await send(stream, _LENGTH.pack(len(payload)) + payload)


async def read_frame(stream: INetStream, max_bytes: int) -> bytes:
    """Read one frame; FrameError if it announces more than max_bytes."""
    (length,) = _LENGTH.unpack(await read_exact(stream, _LENGTH.size))
    if length > max_bytes:
        raise FrameTooLarge(f"frame of {length} bytes exceeds {max_bytes}")
    return await read_exact(stream, length)
