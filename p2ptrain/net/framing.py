"""Length-prefixed frames on a libp2p stream, with a size cap and exact reads."""

from __future__ import annotations

import struct

from libp2p.abc import INetStream
from libp2p.network.stream.exceptions import StreamEOF, StreamReset

_LENGTH = struct.Struct(">I")


class FrameError(ValueError):
    """The peer sent a frame we refuse (too large) or closed the stream mid-frame."""


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
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


async def write_frame(stream: INetStream, payload: bytes) -> None:
    await stream.write(_LENGTH.pack(len(payload)) + payload)


async def read_frame(stream: INetStream, max_bytes: int) -> bytes:
    """Read one frame; FrameError if it announces more than max_bytes."""
    (length,) = _LENGTH.unpack(await read_exact(stream, _LENGTH.size))
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds {max_bytes}")
    return await read_exact(stream, length)
