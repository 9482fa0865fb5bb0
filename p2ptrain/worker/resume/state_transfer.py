"""Stage states between machines: a peer given a stage it never held fetches the agreed step's
checkpoint from a member that announced it (worker/resume/start_step.py), over a p2pd stream.

Protocol `p2ptrain.stage-state.v3`: the client sends a 4-byte big-endian length and a JSON request
`{"layers": "L<a>-<b>", "step": N, "digest": sha256 hex}` (≤ 256 bytes, `StateRequest`:
worker/resume/state_request.py); the server answers one status byte (FOUND, MISSING or BUSY), then,
if found, an 8-byte big-endian size and the file's bytes. The server serves only stamped checkpoint
files of its own checkpoint directory: the one of that stage and step, of any lineage, whose sha256
is the digest (the client asks only for the agreed digest, so the lineage is the one the plan's
members agreed on: worker/resume/start_step.py). v3: the file is a safetensors state
(train/state_file.py, format /3); a file of an older format (a torch pickle) is neither served nor
kept (docs/security.md, 26.7).

Who is served (docs/security.md, 26.12): only peers of this worker's current or previous
plan (a stranger gets MISSING, nothing of the request parsed). A stream waits for its request
in a pending count (MAX_PENDING_PER_PEER a peer, MAX_PENDING in all; past that: BUSY, nothing
parsed); only a request for a state held here, of layers a plan we serve places the peer at
(its stage's, or a stage it builds from them), takes one of the serving slots
(MAX_SERVING_PER_PEER a peer, MAX_SERVING in all; past that: BUSY, and the client retries
until its deadline). One peer gets one state at most MAX_SENDS times a plan, sent in full or
not (a client may lose what it read: its tail, its disk), then MISSING (the client asks the
next holder). A send whose reader takes no chunk for CHUNK_STALL_S, or is under a floor rate, is
cut; the file is checked and sent through one descriptor (worker/resume/served_state.py).

Bounds (docs/security.md, attack 8): both sides refuse a state larger than the stage's expected
size (its weights and AdamW's two moments, with a margin: train/state_bounds.py
`expected_state_bytes`), and both give up after a deadline derived from that size and the plan's
network facts (`transfer_deadline_s`, MAX_TRANSFER_S at most). The client
(worker/resume/state_fetch.py) writes to a temporary file, hashes the bytes as they arrive and
renames the file into place only if their sha256 is the digest the plan's members agreed on
(worker/resume/start_step.py), never a digest the server names. The file is then validated like any
checkpoint when loaded (format, run, model shape, layers, every tensor).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.records import LinkFacts, NetworkFacts, Plan, RunSpec
from p2ptrain.train.checkpoint_folder import layers_key
from p2ptrain.train.state_bounds import expected_state_bytes
from p2ptrain.worker.inbound import OpenStreams, close_after_sender
from p2ptrain.worker.resume.handover import Served
from p2ptrain.worker.resume.served_state import OpenedState, Pace, find_state
from p2ptrain.worker.resume.state_request import StateRequest, read_request
from p2ptrain.worker.traffic import Traffic

if TYPE_CHECKING:  # hivemind is imported only when used: tests of the bounds run beside libp2p
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

    from p2ptrain.worker.pipeline.transport import Transport

log = logging.getLogger(__name__)

PROTOCOL = "p2ptrain.stage-state.v3"
FOUND, MISSING, BUSY = b"\x01", b"\x00", b"\x02"
SIZE = struct.Struct(">Q")
CHUNK_BYTES = 1024 * 1024
REQUEST_TIMEOUT_S = 10.0  # for the few bytes of a request, on top of the plan's round trip
LOCAL_RATE_MBPS = 100.0  # a plan without network facts was made for a LAN (or loopback)
LOCAL_RTT_S = 0.05
# what a transfer's deadline takes of the plan's links at worst: a plan's slowest link is
# whatever one member's link reports made it (rates down to 1 bit/s: a 100 MB state got weeks,
# a stream slot and a fetch held all along); the floor is a slow volunteer uplink's, so an
# honest state still gets the time it needs, up to MAX_TRANSFER_S (10 GB at 4 Mbit/s)
MIN_TRANSFER_RATE_MBPS = 1.0
MAX_TRANSFER_RTT_S = 5.0
MAX_TRANSFER_S = 12 * 3600.0
# a state is a few files per plan change per peer, fetched one by one: more is a flood (each a
# full upload). Only a request for a state held here takes a serving slot: idle openers (two
# spares held all 4) take pending places. A client told BUSY retries until its deadline
MAX_SERVING_PER_PEER = 1
MAX_SERVING = 4
MAX_PENDING_PER_PEER = 2
MAX_PENDING = 16
MAX_SENDS = 3  # sends of one state to one peer begun under one plan, whole or failed
# a send whose reader stalls is cut after one chunk's time at the floor rate (46.8 s), long
# before a large state's deadline; an honest reader at MIN_TRANSFER_RATE_MBPS takes 8.4 s
CHUNK_STALL_S = 10.0 + 4 * MAX_TRANSFER_RTT_S + 2 * CHUNK_BYTES * 8 / (MIN_TRANSFER_RATE_MBPS * 1e6)
BUSY_RETRY_S = (0.5, 1.5)
REFUSAL_LINGER_S = 2.0  # for the client to read a refusal and close its end
# refused streams kept for that at once: each a task and a descriptor, from anyone
MAX_LINGERING = 32


def transfer_deadline_s(size_bytes: int, links: NetworkFacts | LinkFacts | None) -> float:
    """How long moving `size_bytes` may take over `links`: the link to the peer as the plan
    states it (`Plan.link_facts`: its stage group's when the peer holds our stage), or the
    plan's slowest link (NetworkFacts: any peer); twice the time at the rate, a few round
    trips and a constant for the disk (cf. worker/averaging/stage_averager.py); the rate taken
    at MIN_TRANSFER_RATE_MBPS at least, the round trip at MAX_TRANSFER_RTT_S at most, the whole
    at MAX_TRANSFER_S at most."""
    if isinstance(links, NetworkFacts):
        links = links.swarm
    rate_mbps = LOCAL_RATE_MBPS if links is None else max(links.rate_mbps, MIN_TRANSFER_RATE_MBPS)
    rtt_s = LOCAL_RTT_S if links is None else min(links.rtt_s, MAX_TRANSFER_RTT_S)
    return min(MAX_TRANSFER_S, 10.0 + 4 * rtt_s + 2 * size_bytes * 8 / (rate_mbps * 1e6))


class StateServer:
    """Serves this worker's stamped stage checkpoints; `serve_run` follows the current plan."""

    def __init__(
        self, transport: Transport | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock  # a send's pace is measured by it
        self.directory: Path | None = None
        self.spec: RunSpec | None = None
        self.network: NetworkFacts | None = None
        self._max_bytes: dict[str, int] = {}  # layers key -> expected_state_bytes
        self._plan: Plan | None = None
        self._previous: Plan | None = None  # its peers may still fetch under it
        self._peers: frozenset[str] = frozenset()  # of the current and the previous plan
        # streams being sent a state, per peer; refused: strangers, over the caps, repeats
        self.streams = OpenStreams("stage state requests")
        self.pending = OpenStreams("stage state requests")  # not read yet, or answered
        self._tries: collections.Counter[tuple[str, str]] = collections.Counter()  # this plan's
        self._sending: set[tuple[str, str]] = set()
        self._lingering = 0  # refused streams waiting for their client to close
        self.served = Served()  # what was sent in full: a donor's hand-over waits on it
        self.traffic = Traffic() if transport is None else transport.traffic
        if transport is not None:  # None: a test drives _handle itself
            transport.call(transport.p2p.add_binary_stream_handler(PROTOCOL, self._handle))

    @property
    def plan(self) -> Plan | None:
        """The current plan (None before the first)."""
        return self._plan

    @property
    def num_refused(self) -> int:
        return self.streams.num_refused

    def serve_run(self, spec: RunSpec, directory: Path, plan: Plan) -> None:
        """Serve `directory`'s states of `spec`'s model to the peers of `plan` and of the plan
        before it, within the bounds of the plan's network facts."""
        if spec != self.spec:
            self._max_bytes = {}
        if self._plan is None or plan.key != self._plan.key:
            before = self._plan.peers() if self._plan is not None else set()
            self._peers = frozenset(plan.peers() | before)
            self._plan, self._previous = plan, self._plan
            self._tries = collections.Counter()
        self.spec, self.directory, self.network = spec, directory, plan.network

    def max_bytes(self, layers: range) -> int | None:
        """The largest state of `layers` this run can have (None: not a stage of the run)."""
        spec = self.spec
        if spec is None or layers.stop > spec.model.n_layer:
            return None
        key = layers_key(layers)
        if key not in self._max_bytes:
            self._max_bytes[key] = expected_state_bytes(spec, layers)
        return self._max_bytes[key]

    async def _handle(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = info.peer_id.to_base58()
        refusal = self._refusal(remote)
        if refusal is not None:  # nothing of the request is parsed
            await self.refuse(remote, refusal, reader, writer)
            return
        with contextlib.ExitStack() as slot:
            slot.enter_context(self.pending.serving(remote))
            await self._serve(remote, reader, writer, slot)

    def take_slot(self, remote: str, slot: contextlib.ExitStack, per_peer: int) -> bool:
        """Move a stream whose request is to be served from the pending count to the serving
        one, for the rest of its life; False (it is to be answered BUSY) if they are full."""
        if self.streams.of(remote) >= per_peer or self.streams.total() >= MAX_SERVING:
            self.streams.refused(remote)
            return False
        slot.close()  # out of the pending count
        slot.enter_context(self.streams.serving(remote))
        return True

    async def refuse(
        self,
        remote: str,
        answer: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Answer `remote` with `answer` (MISSING, BUSY) alone, and let it read that first."""
        self.streams.refused(remote)
        writer.write(answer)
        if self._lingering >= MAX_LINGERING:  # a flood of refusals: closed at once
            writer.close()
            return
        self._lingering += 1
        try:
            await close_after_sender(reader, writer, REFUSAL_LINGER_S)
        finally:
            self._lingering -= 1

    def pending_refusal(self, remote: str, per_peer: int = MAX_PENDING_PER_PEER) -> bool:
        """Is a new stream of `remote` over the caps on streams not yet served (BUSY)?"""
        return self.pending.of(remote) >= per_peer or self.pending.total() >= MAX_PENDING

    def _refusal(self, remote: str) -> bytes | None:
        """The answer to a stream of `remote` not to be read at all, or None."""
        if remote not in self._peers:
            return MISSING  # a stranger to our plans: told nothing about what we hold
        return BUSY if self.pending_refusal(remote) else None

    async def _serve(
        self,
        remote: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        slot: contextlib.ExitStack,
    ) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S + 4 * LOCAL_RTT_S):
                request = await read_request(reader)
            if request.have:  # a peer of the plan holds it: our hand-over need not wait for it
                self.served.claim(remote, request.digest)
                writer.write(MISSING)
                return
            writer.write(await self._send(remote, request, writer, slot))
        except (ValueError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("stage state request from %s failed: %r", remote, exc)
        finally:
            await close_after_sender(reader, writer)  # let the client read the end first

    async def _send(
        self,
        remote: str,
        request: StateRequest,
        writer: asyncio.StreamWriter,
        slot: contextlib.ExitStack,
    ) -> bytes:
        """Send the state `request` names if `remote` may have it now: what is left to write
        (b"" once it is sent, MISSING or BUSY otherwise)."""
        pair = (remote, request.digest)
        if self._tries[pair] >= MAX_SENDS or not self._needs(remote, request):
            self.streams.refused(remote)  # each send is a full upload of ours
            return MISSING
        max_bytes = self.max_bytes(request.layers)
        opened = None if max_bytes is None else await self._find(request)
        if opened is None or max_bytes is None:
            return MISSING
        with contextlib.closing(opened):  # the very file whose digest was checked is sent
            if pair in self._sending or not self.take_slot(remote, slot, MAX_SERVING_PER_PEER):
                return BUSY
            self._tries[pair] += 1
            self._sending.add(pair)
            try:
                if not await self.send_file(remote, writer, opened, max_bytes, FOUND):
                    return MISSING
            finally:
                self._sending.discard(pair)
        self.served.add(remote, request.digest)
        return b""

    def _needs(self, remote: str, request: StateRequest) -> bool:
        """Does a plan we serve (the current or the previous) place `remote` at a stage that
        shares blocks with the request's (its own, or one it builds from them anew)?"""
        spec, layers = self.spec, request.layers
        for plan in filter(None, (self._plan, self._previous)):
            if spec is None or (role := plan.role_of(remote)) is None:
                continue
            with contextlib.suppress(ValueError):  # a plan that does not cut this model
                stage = plan.layer_ranges(spec.model.n_layer)[role.stage]
                if stage.start < layers.stop and layers.start < stage.stop:
                    return True
        return False

    async def send_file(
        self,
        remote: str,
        writer: asyncio.StreamWriter,
        opened: OpenedState,
        max_bytes: int,
        head: bytes,
    ) -> bool:
        """Send `head`, the size of the `opened` state file and its bytes to `remote`, from its
        descriptor, within the deadline for that size and at the floor rate at least (TooSlow);
        False (nothing sent) if the file is no state a peer may take: larger than `max_bytes` or
        of an older format (a torch pickle)."""
        # local disk reads of <= 1 MiB are short next to the network writes between them
        f, size, name = opened.file, opened.size, opened.path.name
        if size > max_bytes or opened.pickled:
            log.warning(
                "%s (%d bytes, the stage's states <= %d%s) is not served",
                name,
                size,
                max_bytes,
                ", an older format: a torch pickle" if opened.pickled else "",
            )
            return False
        f.seek(0)
        deadline_s = transfer_deadline_s(size, self.network)
        async with asyncio.timeout(deadline_s):
            writer.write(head + SIZE.pack(size))
            pace = Pace(self.clock, size / (deadline_s * MAX_SERVING))  # served_state.py
            while chunk := f.read(CHUNK_BYTES):
                writer.write(chunk)
                async with asyncio.timeout(CHUNK_STALL_S):  # a stalled reader frees its slot
                    await writer.drain()
                self.traffic.sent(remote, len(chunk))
                pace.took(len(chunk))  # and so does a slow-but-steady one
        log.info("sent %s (%d bytes) to %s", name, size, remote)
        return True

    async def _find(self, request: StateRequest) -> OpenedState | None:
        """The stamped state of the request's layers at its step (of any lineage) whose sha256
        is its digest, open (the caller closes it)."""
        if self.directory is None:
            return None
        # hashing a large state is slow: a thread (remembered while the file is unchanged)
        found = (self.directory, request.layers, request.step, request.digest)
        return await asyncio.to_thread(find_state, *found)
