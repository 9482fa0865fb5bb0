"""Fetching a stage state from a member that holds it (the client of `p2ptrain.stage-state.v3`,
worker/resume/state_transfer.py has the protocol and the server): the bytes go to a temporary
file, hashed as they arrive, and are renamed into place only if their sha256 is the digest the
plan's members agreed on (worker/resume/start_step.py), never a digest the server names, and the
file is a state of format /3 within the stage's bounds."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.durable import sync_directory
from p2ptrain.errors import WireError
from p2ptrain.records import LinkFacts, NetworkFacts
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint_folder import layers_key, stamped_path, unfinished_prefix
from p2ptrain.worker.resume.state_request import StateRequest
from p2ptrain.worker.resume.state_transfer import (
    BUSY,
    BUSY_RETRY_S,
    CHUNK_BYTES,
    FOUND,
    PROTOCOL,
    SIZE,
    transfer_deadline_s,
)

if TYPE_CHECKING:  # hivemind is imported only when used: tests of the bounds run beside libp2p
    from p2ptrain.worker.pipeline.transport import Transport


log = logging.getLogger(__name__)

TELL_TIMEOUT_S = 10.0


class Busy(Exception):
    """The holder serves as many transfers as it will: ask again a little later."""


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
    max_tensors: int | None = None,
) -> Path:
    """Fetch `peer_id`'s stamped state of `layers` at `step` whose sha256 is `digest` into
    `directory`, under lineage `tag` (the fetching plan's: the state it agreed on); its path.
    Kept only if the bytes' sha256 is `digest` and they are at most `max_bytes` (and a header
    for at most `max_tensors` tensors: `expected_state_tensors`), moved before
    the deadline for that size on `network`. Raises (OSError, ValueError, TimeoutError...) if
    the peer does not have it, offers more, sends other bytes, or is too slow."""
    target = stamped_path(directory, layers, step, tag)
    deadline_s = transfer_deadline_s(max_bytes, network)
    request = StateRequest(layers, step, digest)
    coroutine = _fetch(transport, peer_id, request, target, max_bytes, deadline_s, max_tensors)
    transport.call(coroutine, timeout_s=deadline_s + 10)
    return target


def tell_held(transport: Transport, peer_id: str, states: list[tuple[range, int, str]]) -> None:
    """Tell `peer_id` (a spare that waits for us to fetch them) that we hold these states
    (layers, step, sha256) already: a request with `have` each, one after another (the server
    serves 2 streams of a peer at once: more would be busy), on the transport's loop while we
    go on training (a spare we cannot reach costs nobody a wait: it waits its limit out)."""
    requests = [StateRequest(layers, step, digest, have=True) for layers, step, digest in states]
    told = transport.submit(_tell(transport, peer_id, requests))
    told.add_done_callback(lambda done: _log_untold(done, peer_id))


def _log_untold(done: Future[None], peer_id: str) -> None:
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.info("could not tell %s this peer holds the state it offers: %r", peer_id, exc)


async def _tell(transport: Transport, peer_id: str, requests: list[StateRequest]) -> None:
    from hivemind.p2p import PeerID

    async with asyncio.timeout(TELL_TIMEOUT_S):
        for request in requests:
            while True:
                _, reader, writer = await transport.p2p.call_binary_stream_handler(
                    PeerID.from_base58(peer_id), PROTOCOL
                )
                try:
                    writer.write(request.encode())
                    await writer.drain()
                    answer = await reader.read(1)  # the request has arrived, unless busy
                finally:
                    writer.close()
                if answer != BUSY:
                    break
                await asyncio.sleep(random.uniform(*BUSY_RETRY_S))


async def _fetch(
    transport: Transport,
    peer_id: str,
    request: StateRequest,
    target: Path,
    max_bytes: int,
    deadline_s: float,
    max_tensors: int | None,
) -> None:
    from hivemind.p2p import PeerID

    body, what = request.encode(), f"{peer_id}'s {layers_key(request.layers)}@{request.step}"
    async with asyncio.timeout(deadline_s):
        while True:
            _, reader, writer = await transport.p2p.call_binary_stream_handler(
                PeerID.from_base58(peer_id), PROTOCOL
            )
            try:
                writer.write(body)
                await writer.drain()
                transport.traffic.sent(peer_id, len(body))
                await receive_state(
                    reader,
                    target,
                    request.digest,
                    max_bytes,
                    what,
                    on_bytes=lambda n: transport.traffic.received(peer_id, n),
                    max_tensors=max_tensors,
                )
                return
            except Busy:  # the holder serves others now: again after a pause
                await asyncio.sleep(random.uniform(*BUSY_RETRY_S))
            finally:
                writer.close()


async def receive_state(
    reader: asyncio.StreamReader,
    target: Path,
    digest: str,
    max_bytes: int,
    what: str,
    on_bytes: Callable[[int], None] | None = None,
    max_tensors: int | None = None,
) -> None:
    """Read a reply (status, size, bytes) into `target`: only a state file of format /3 (no
    pickle: train/state_file.py) of at most `max_bytes` whose sha256 is `digest`; nothing is
    left on disk otherwise. `on_bytes` is told how many bytes of the file each chunk brought
    (the worker's traffic counters); `max_tensors` bounds the file's header before it is parsed.
    Busy if the holder is serving as many as it will."""
    status = await reader.readexactly(1)
    if status == BUSY:
        raise Busy(f"{what}: busy")
    if status != FOUND:
        raise FileNotFoundError(f"{what}: not found")
    await receive_file(reader, target, digest, max_bytes, what, on_bytes, max_tensors)


async def receive_file(
    reader: asyncio.StreamReader,
    target: Path,
    digest: str,
    max_bytes: int,
    what: str,
    on_bytes: Callable[[int], None] | None = None,
    max_tensors: int | None = None,
    validate: Callable[[Path], object] | None = None,
) -> None:
    """Read a state file (its size, then its bytes) into `target`, as `receive_state` keeps it;
    `validate` (raising if the file is refused) runs on a thread before the file takes its
    name, so a file refused, or a transfer cancelled, never lands."""
    (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
    if size > max_bytes:
        raise ValueError(f"{what}: {size} bytes offered, the stage's states are <= {max_bytes}")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        dir=target.parent, prefix=unfinished_prefix(target), suffix=".part"
    )
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
            f.flush()  # its bytes on disk before its name: a power cut leaves no torn state
            await asyncio.to_thread(os.fsync, f.fileno())
        if sha256.hexdigest() != digest:
            raise ValueError(f"{what}: sha256 {sha256.hexdigest()}, agreed {digest}")
        # the agreed bytes may still be a lone holder's: never keep what would be unpickled
        if state_file.is_pickled(Path(tmp_name)):
            raise WireError(f"malformed stage state: {what} is a torch pickle (an older format)")
        state_file.check(Path(tmp_name), max_tensors)
        if validate is not None:
            await asyncio.to_thread(validate, Path(tmp_name))
        os.replace(tmp_name, target)
        await asyncio.to_thread(sync_directory, target.parent)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)  # noqa: ASYNC240 (a local unlink)
        raise
