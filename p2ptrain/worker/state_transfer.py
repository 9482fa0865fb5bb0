"""Stage states between machines: a peer given a stage it never held fetches the agreed step's
checkpoint from a member that announced it (worker/resume.py), over a p2pd stream.

Protocol `p2ptrain.stage-state.v1`: the client sends a 4-byte big-endian length and a JSON request
`{"layers": "L<a>-<b>", "step": N}` (≤ 256 bytes); the server answers one status byte (FOUND or
MISSING), then, if found, an 8-byte big-endian size and the file's bytes. The server serves only
stamped checkpoint files of its own checkpoint directory; the client bounds the size, writes to a
temporary file and renames it into place. The file is validated like any checkpoint when loaded
(format, run, model shape, layers, every tensor), so a lying server costs a retry, not the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from p2ptrain.train.checkpoint import layers_key, stamped_path

if TYPE_CHECKING:
    from p2ptrain.worker.transport import Transport

log = logging.getLogger(__name__)

PROTOCOL = "p2ptrain.stage-state.v1"
FOUND, MISSING = b"\x01", b"\x00"
REQUEST_LEN = struct.Struct(">I")
SIZE = struct.Struct(">Q")
MAX_REQUEST_BYTES = 256
MAX_STATE_BYTES = 16 * 1024**3
CHUNK_BYTES = 1024 * 1024
TRANSFER_TIMEOUT_S = 600.0
_LAYERS = re.compile(r"^L(\d{1,6})-(\d{1,6})$")


def parse_layers(key: str) -> range | None:
    match = _LAYERS.match(key)
    if not match or int(match[1]) >= int(match[2]):
        return None
    return range(int(match[1]), int(match[2]))


class StateServer:
    """Serves this worker's stamped stage checkpoints; `directory` follows the current run."""

    def __init__(self, transport: Transport) -> None:
        self.directory: Path | None = None
        transport.call(transport.p2p.add_binary_stream_handler(PROTOCOL, self._handle))

    async def _handle(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = info.peer_id.to_base58()
        try:
            async with asyncio.timeout(TRANSFER_TIMEOUT_S):
                path = await self._requested_path(reader)
                if path is None or not path.is_file():
                    writer.write(MISSING)
                    return
                # local disk reads of <= 1 MiB are short next to the network writes between them;
                # open once, so a concurrent prune of the history cannot tear the file
                with open(path, "rb") as f:  # noqa: ASYNC230
                    size = os.fstat(f.fileno()).st_size
                    writer.write(FOUND + SIZE.pack(size))
                    while chunk := f.read(CHUNK_BYTES):
                        writer.write(chunk)
                        await writer.drain()
                log.info("sent %s (%d bytes) to %s", path.name, size, remote)
        except (ValueError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("stage state request from %s failed: %r", remote, exc)
        finally:
            with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
                await writer.drain()
                async with asyncio.timeout(5.0):  # let the client read the end before closing
                    while await reader.read(65536):
                        pass
            writer.close()

    async def _requested_path(self, reader: asyncio.StreamReader) -> Path | None:
        (length,) = REQUEST_LEN.unpack(await reader.readexactly(REQUEST_LEN.size))
        if length > MAX_REQUEST_BYTES:
            raise ValueError(f"request of {length} bytes")
        request = json.loads(await reader.readexactly(length))
        if not isinstance(request, dict):
            raise ValueError("request is not an object")
        layers = parse_layers(request.get("layers", ""))
        step = request.get("step")
        if layers is None or not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"bad request {request!r}")
        return None if self.directory is None else stamped_path(self.directory, layers, step)


def fetch_state(
    transport: Transport, peer_id: str, layers: range, step: int, directory: Path
) -> Path:
    """Fetch `peer_id`'s stamped state of `layers` at `step` into `directory`; its path.
    Raises (OSError, ValueError, TimeoutError...) if the peer does not have it or fails."""
    target = stamped_path(directory, layers, step)
    coroutine = _fetch(transport, peer_id, layers_key(layers), step, target)
    transport.call(coroutine, timeout_s=TRANSFER_TIMEOUT_S + 10)
    return target


async def _fetch(transport: Transport, peer_id: str, key: str, step: int, target: Path) -> None:
    async with asyncio.timeout(TRANSFER_TIMEOUT_S):
        _, reader, writer = await transport.p2p.call_binary_stream_handler(
            PeerID.from_base58(peer_id), PROTOCOL
        )
        try:
            body = json.dumps({"layers": key, "step": step}).encode()
            writer.write(REQUEST_LEN.pack(len(body)) + body)
            await writer.drain()
            if await reader.readexactly(1) != FOUND:
                raise FileNotFoundError(f"{peer_id} has no {key} at step {step}")
            (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
            if size > MAX_STATE_BYTES:
                raise ValueError(f"{peer_id} offers {size} bytes for {key}")
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f:
                    left = size
                    while left:
                        chunk = await reader.read(min(left, CHUNK_BYTES))
                        if not chunk:
                            raise asyncio.IncompleteReadError(b"", left)
                        f.write(chunk)
                        left -= len(chunk)
                os.replace(tmp_name, target)
            except BaseException:
                Path(tmp_name).unlink(missing_ok=True)  # noqa: ASYNC240 (a local unlink)
                raise
        finally:
            writer.close()
