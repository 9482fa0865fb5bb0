"""Stage states between machines: a peer given a stage it never held fetches the agreed step's
checkpoint from a member that announced it (worker/resume.py), over a p2pd stream.

Protocol `p2ptrain.stage-state.v2`: the client sends a 4-byte big-endian length and a JSON request
`{"layers": "L<a>-<b>", "step": N, "digest": sha256 hex}` (≤ 256 bytes); the server answers one
status byte (FOUND or MISSING), then, if found, an 8-byte big-endian size and the file's bytes.
The server serves only stamped checkpoint files of its own checkpoint directory: the one of that
stage and step, of any lineage, whose sha256 is the digest (the client asks only for the agreed
digest, so the lineage is the one the plan's members agreed on: worker/resume.py).

Bounds (docs/security.md, attack 8): both sides refuse a state larger than the stage's expected
size (its weights and AdamW's two moments, with a margin: train/checkpoint.py
`expected_state_bytes`), and both give up after a deadline derived from that size and the plan's
network facts (`transfer_deadline_s`). The client writes to a temporary file, hashes the bytes as
they arrive and renames the file into place only if their sha256 is the digest the plan's
members agreed on (worker/resume.py), never a digest the server names. The file is then
validated like any checkpoint when loaded (format, run, model shape, layers, every tensor).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.records import LinkFacts, NetworkFacts, RunSpec
from p2ptrain.train.checkpoint import (
    expected_state_bytes,
    file_sha256,
    layers_key,
    list_states,
    stamped_path,
)

if TYPE_CHECKING:  # hivemind is imported only when used: tests of the bounds run beside libp2p
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

    from p2ptrain.worker.transport import Transport

log = logging.getLogger(__name__)

PROTOCOL = "p2ptrain.stage-state.v2"
FOUND, MISSING = b"\x01", b"\x00"
REQUEST_LEN = struct.Struct(">I")
SIZE = struct.Struct(">Q")
MAX_REQUEST_BYTES = 256
CHUNK_BYTES = 1024 * 1024
REQUEST_TIMEOUT_S = 10.0  # for the few bytes of a request, on top of the plan's round trip
LOCAL_RATE_MBPS = 100.0  # a plan without network facts was made for a LAN (or loopback)
LOCAL_RTT_S = 0.05
_LAYERS = re.compile(r"^L(\d{1,6})-(\d{1,6})$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def parse_layers(key: str) -> range | None:
    match = _LAYERS.match(key)
    if not match or int(match[1]) >= int(match[2]):
        return None
    return range(int(match[1]), int(match[2]))


def transfer_deadline_s(size_bytes: int, links: NetworkFacts | LinkFacts | None) -> float:
    """How long moving `size_bytes` may take over `links`: the link to the peer as the plan
    states it (`Plan.link_facts`: its stage group's when the peer holds our stage), or the
    plan's slowest link (NetworkFacts: any peer); twice the time at the rate, a few round
    trips and a constant for the disk (cf. worker/averaging.py)."""
    if isinstance(links, NetworkFacts):
        links = links.swarm
    rate_mbps = LOCAL_RATE_MBPS if links is None else links.rate_mbps
    rtt_s = LOCAL_RTT_S if links is None else links.rtt_s
    return 10.0 + 4 * rtt_s + 2 * size_bytes * 8 / (rate_mbps * 1e6)


class StateServer:
    """Serves this worker's stamped stage checkpoints; `serve_run` follows the current run."""

    def __init__(self, transport: Transport) -> None:
        self.directory: Path | None = None
        self.spec: RunSpec | None = None
        self.network: NetworkFacts | None = None
        self._max_bytes: dict[str, int] = {}  # layers key -> expected_state_bytes
        self.traffic = transport.traffic
        transport.call(transport.p2p.add_binary_stream_handler(PROTOCOL, self._handle))

    def serve_run(self, spec: RunSpec, directory: Path, network: NetworkFacts | None) -> None:
        """Serve `directory`'s states of `spec`'s model, within the bounds of `network`."""
        if spec != self.spec:
            self._max_bytes = {}
        self.spec, self.directory, self.network = spec, directory, network

    def max_bytes(self, layers: range) -> int | None:
        """The largest state of `layers` this run can have (None: not a stage of the run)."""
        spec = self.spec
        if spec is None or layers.stop > spec.n_layer:
            return None
        key = layers_key(layers)
        if key not in self._max_bytes:
            self._max_bytes[key] = expected_state_bytes(spec, layers)
        return self._max_bytes[key]

    async def _handle(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = info.peer_id.to_base58()
        network = self.network
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S + 4 * LOCAL_RTT_S):
                layers, step, digest = await read_request(reader)
            path, max_bytes = await self._find(layers, step, digest)
            if path is None or max_bytes is None or not path.is_file():
                writer.write(MISSING)
                return
            # local disk reads of <= 1 MiB are short next to the network writes between them;
            # open once, so a concurrent prune of the history cannot tear the file
            with open(path, "rb") as f:  # noqa: ASYNC230
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:  # not a state of this run's stage: never send it
                    log.warning("%s holds %d bytes, over the stage's %d: not served",
                                path.name, size, max_bytes)  # fmt: skip
                    writer.write(MISSING)
                    return
                async with asyncio.timeout(transfer_deadline_s(size, network)):
                    writer.write(FOUND + SIZE.pack(size))
                    while chunk := f.read(CHUNK_BYTES):
                        writer.write(chunk)
                        await writer.drain()
                        self.traffic.sent(remote, len(chunk))
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

    async def _find(self, layers: range, step: int, digest: str) -> tuple[Path | None, int | None]:
        """The stamped state of `layers` at `step` (of any lineage) whose sha256 is `digest`."""
        if self.directory is None:
            return None, None
        key = layers_key(layers)
        for state in list_states(self.directory):
            if state.key == key and state.step == step:
                # usually cached by the announcement; hashing a large state is slow: a thread
                with contextlib.suppress(OSError):
                    if await asyncio.to_thread(file_sha256, state.path) == digest:
                        return state.path, self.max_bytes(layers)
        return None, None


async def read_request(reader: asyncio.StreamReader) -> tuple[range, int, str]:
    """A client's request: (layers, step, digest); ValueError if malformed."""
    (length,) = REQUEST_LEN.unpack(await reader.readexactly(REQUEST_LEN.size))
    if length > MAX_REQUEST_BYTES:
        raise ValueError(f"request of {length} bytes")
    request = json.loads(await reader.readexactly(length))
    if not isinstance(request, dict):
        raise ValueError("request is not an object")
    layers = parse_layers(request.get("layers", ""))
    step, digest = request.get("step"), request.get("digest")
    if layers is None or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"bad request {request!r}")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ValueError(f"bad request {request!r}")
    return layers, step, digest


def fetch_state(
    transport: Transport,
    peer_id: str,
    layers: range,
    step: int,
    directory: Path,
    digest: str,
    max_bytes: int,
    network: NetworkFacts | LinkFacts | None,
    tag: str | None = None,
) -> Path:
    """Fetch `peer_id`'s stamped state of `layers` at `step` whose sha256 is `digest` into
    `directory`, under lineage `tag` (the fetching plan's: the state it agreed on); its path.
    Kept only if the bytes' sha256 is `digest` and they are at most `max_bytes`, moved before
    the deadline for that size on `network`. Raises (OSError, ValueError, TimeoutError...) if
    the peer does not have it, offers more, sends other bytes, or is too slow."""
    target = stamped_path(directory, layers, step, tag)
    deadline_s = transfer_deadline_s(max_bytes, network)
    coroutine = _fetch(
        transport, peer_id, layers_key(layers), step, target, digest, max_bytes, deadline_s
    )
    transport.call(coroutine, timeout_s=deadline_s + 10)
    return target


async def _fetch(
    transport: Transport,
    peer_id: str,
    key: str,
    step: int,
    target: Path,
    digest: str,
    max_bytes: int,
    deadline_s: float,
) -> None:
    from hivemind.p2p import PeerID

    async with asyncio.timeout(deadline_s):
        _, reader, writer = await transport.p2p.call_binary_stream_handler(
            PeerID.from_base58(peer_id), PROTOCOL
        )
        try:
            body = json.dumps({"layers": key, "step": step, "digest": digest}).encode()
            writer.write(REQUEST_LEN.pack(len(body)) + body)
            await writer.drain()
            transport.traffic.sent(peer_id, REQUEST_LEN.size + len(body))
            await receive_state(
                reader, target, digest, max_bytes, f"{peer_id}'s {key}@{step}",
                on_bytes=lambda n: transport.traffic.received(peer_id, n),
            )  # fmt: skip
        finally:
            writer.close()


async def receive_state(
    reader: asyncio.StreamReader,
    target: Path,
    digest: str,
    max_bytes: int,
    what: str,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Read a reply (status, size, bytes) into `target`: only a state of at most `max_bytes`
    whose sha256 is `digest`; nothing is left on disk otherwise. `on_bytes` is told how many
    bytes of the file each chunk brought (the worker's traffic counters)."""
    if await reader.readexactly(1) != FOUND:
        raise FileNotFoundError(f"{what}: not found")
    (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
    if size > max_bytes:
        raise ValueError(f"{what}: {size} bytes offered, the stage's states are <= {max_bytes}")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".part")
    try:
        sha256 = hashlib.sha256()
        with os.fdopen(fd, "wb") as f:
            left = size
            while left:
                chunk = await reader.read(min(left, CHUNK_BYTES))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", left)
                sha256.update(chunk)
                f.write(chunk)
                left -= len(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        if sha256.hexdigest() != digest:
            raise ValueError(f"{what}: sha256 {sha256.hexdigest()}, agreed {digest}")
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)  # noqa: ASYNC240 (a local unlink)
        raise
