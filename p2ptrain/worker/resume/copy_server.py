"""The holder's side of spare copies (worker/resume/copies.py has the spare's), and the rules both
sides share: which spare copies which stage, how often.

Protocol `p2ptrain.stage-copy.v1`: the client sends a 4-byte big-endian length and a JSON request
`{"layers": "L<a>-<b>", "min_step": N}` (≤ 256 bytes, `CopyRequest`); the server answers one status
byte (FOUND, MISSING or BUSY, as stage-state.v3) and, if found, the state's step (8 bytes,
big-endian), its sha256 (32 bytes), the length of its lineage tag (1 byte, 0 for an untagged
state) and the tag, then the file's size and bytes as stage-state.v3 sends them: its newest
state of those layers its plan may use, at step N or later.

Who is served (docs/security.md, 34.1): the spare the newest plan gives that copy duty (anyone
else: MISSING, nothing parsed), for the stage this worker trains, one copy per half its gap
(else BUSY), within the state server's caps on streams (state_transfer.py). The client keeps
the bytes only if they are a state of format /3 within the stage's bounds whose sha256 is the
one sent, at a step from the one asked and before the run's last, under a tag its plan may use,
and if they load as a state of those layers (train/checkpoint_read.py): a hostile holder can
make a copy wrong, which its own state already is (the holder alone decides its stage: "Not
defended yet", 4b), nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2ptrain.records import LinkFacts, Plan, RunSpec
from p2ptrain.records import fields as f
from p2ptrain.train.checkpoint import written
from p2ptrain.train.checkpoint_folder import layers_key, list_states
from p2ptrain.worker.inbound import BAD_INPUT, close_after_sender, read_prefixed
from p2ptrain.worker.resume.served_state import open_state
from p2ptrain.worker.resume.state_request import (
    MAX_REQUEST_BYTES,
    REQUEST_LEN,
    encode_request,
    parse_layers,
    request_json,
)
from p2ptrain.worker.resume.state_transfer import (
    BUSY,
    FOUND,
    LOCAL_RATE_MBPS,
    LOCAL_RTT_S,
    MISSING,
    REQUEST_TIMEOUT_S,
    StateServer,
)

if TYPE_CHECKING:  # hivemind is imported only when used: tests of the rules run beside libp2p
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

    from p2ptrain.worker.pipeline.transport import Transport

log = logging.getLogger(__name__)

COPY_PROTOCOL = "p2ptrain.stage-copy.v1"
HEAD = struct.Struct(">Q32sB")  # the state's step, sha256 and tag length
MAX_TAG = 40  # "<16 hex>-e<up to 16 digits>"
LINK_SHARE = 0.1  # a copy's share of the link between spare and holder, at most
_REQUEST = "stage copy request"

Duty = tuple[range, str]  # the layers a spare copies, and their holder


@dataclass(frozen=True)
class CopyRequest:
    """What a spare asks a holder for: its newest state of `layers` at `min_step` or later."""

    layers: range
    min_step: int

    def to_dict(self) -> dict[str, Any]:
        return {"layers": layers_key(self.layers), "min_step": self.min_step}

    def encode(self) -> bytes:
        return encode_request(self.to_dict())

    @classmethod
    def from_dict(cls, data: object) -> CopyRequest:
        raw = f.mapping(data, _REQUEST)
        f.require_keys(raw, _REQUEST, ("layers", "min_step"))
        layers = parse_layers(raw["layers"])
        if layers is None:
            raise f.malformed(_REQUEST, "layers must be L<start>-<stop>, start < stop")
        return cls(layers, f.integer(raw["min_step"], _REQUEST, "min_step"))

    @classmethod
    def decode(cls, body: bytes) -> CopyRequest:
        """A request's JSON body (after its length): a valid request, or WireError."""
        return cls.from_dict(request_json(body, _REQUEST))


def copies_on(spec: RunSpec) -> bool:
    """Does the run keep copies? Not without interval saves: there would be nothing to copy."""
    return spec.checkpoint.spare_copy_interval_s > 0 and spec.checkpoint.checkpoint_interval > 0


def copy_duties(plan: Plan, me: str, n_layer: int) -> list[Duty]:
    """The stages this spare keeps copies of, with their holders: none unless the plan is one
    pipeline (a stage with replicas has its copies) and `me` is one of its spares that stays (a
    donor leaves once its own stage is fetched: control/handover.py)."""
    copiers = [spare for spare in plan.spares if spare not in plan.donors]
    if len(plan.pipelines) != 1 or me not in copiers:
        return []
    holders, ranges = plan.pipelines[0], plan.layer_ranges(n_layer)
    position, count = copiers.index(me), len(copiers)
    return [(ranges[j], holders[j]) for j in range(len(holders)) if j % count == position]


def copy_gap_s(spec: RunSpec, size_bytes: int, links: LinkFacts | None) -> float:
    """Seconds between two copies of a state of `size_bytes` over `links`: the run's interval,
    or longer where a copy would take more than LINK_SHARE of the link."""
    rate_mbps = LOCAL_RATE_MBPS if links is None else links.rate_mbps
    moving_s = size_bytes * 8 / (rate_mbps * 1e6)
    return max(spec.checkpoint.spare_copy_interval_s, moving_s / LINK_SHARE)


class CopyServer:
    """Answers the spares that copy our stage with this worker's newest saved state of it."""

    def __init__(
        self,
        states: StateServer,
        me: str,
        transport: Transport | None,
        latest: Callable[[], Plan | None],
    ) -> None:
        self._states = states  # its session's plan, run, directory, network, caps and refusals
        self._me = me
        self._latest = latest  # the newest plan: one of the same placement adds spares
        self._last_s: dict[str, float] = {}  # when each spare was last sent a copy
        if transport is not None:  # None: a test drives `refusal` and `serve` itself
            transport.call(transport.p2p.add_binary_stream_handler(COPY_PROTOCOL, self._handle))

    async def _handle(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = info.peer_id.to_base58()
        refusal = self.refusal(remote)
        if refusal is not None:  # nothing of the request is parsed
            await self._states.refuse(remote, refusal, reader, writer)
            return
        with contextlib.ExitStack() as slot:  # pending until its request is to be served
            slot.enter_context(self._states.pending.serving(remote))
            await self.serve(remote, reader, writer, slot)

    def _duty_of(self, remote: str) -> range | None:
        """The layers `remote` copies from us under the newest plan, if any."""
        spec, plan = self._states.spec, self._latest() or self._states.plan
        if spec is None or plan is None or not copies_on(spec):
            return None
        duties = copy_duties(plan, remote, spec.model.n_layer)
        return next((layers for layers, holder in duties if holder == self._me), None)

    def refusal(self, remote: str) -> bytes | None:
        """The answer to a request of `remote` not to be served at all, or None."""
        if self._duty_of(remote) is None:
            return MISSING  # only the spare that copies our stage is served
        if len(self._last_s) > 1024:  # spares of many plans: forget the oldest
            self._last_s = dict(sorted(self._last_s.items(), key=lambda i: i[1])[-512:])
        # one stream of the copier at once, of either protocol
        if self._states.streams.of(remote) or self._states.pending_refusal(remote, 1):
            return BUSY
        return None

    async def serve(
        self,
        remote: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        slot: contextlib.ExitStack | None = None,
    ) -> None:
        """Read `remote`'s request and send it the newest state it asks for, if it may have it;
        `slot` holds the stream's place in the state server's counts (None: not counted)."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S + 4 * LOCAL_RTT_S):
                request = CopyRequest.decode(
                    await read_prefixed(reader, REQUEST_LEN, MAX_REQUEST_BYTES, _REQUEST)
                )
            # the duty first: the bound of other layers would build a stage on our loop
            found = self._newest(request) if request.layers == self._duty_of(remote) else None
            max_bytes = None if found is None else self._states.max_bytes(request.layers)
            if found is None or max_bytes is None:
                writer.write(MISSING)
                return
            step, tag, path = found
            plan, spec = self._states.plan, self._states.spec
            assert plan is not None and spec is not None
            gap_s = copy_gap_s(spec, path.stat().st_size, plan.link_facts(self._me, remote))
            if time.monotonic() - self._last_s.get(remote, -gap_s) < gap_s / 2:
                writer.write(BUSY)  # it asked again too soon: a copy costs our uplink
                return
            if slot is not None and not self._states.take_slot(remote, slot, 1):
                writer.write(BUSY)  # the state server's slots are full
                return
            # opened once: the digest named is that of the bytes sent, whatever the name holds
            opened = await asyncio.to_thread(open_state, path)  # hashed on a thread, remembered
            with contextlib.closing(opened):
                raw_tag = (tag or "").encode()
                digest = bytes.fromhex(opened.digest)
                head = FOUND + HEAD.pack(step, digest, len(raw_tag)) + raw_tag
                self._last_s[remote] = time.monotonic()
                if not await self._states.send_file(remote, writer, opened, max_bytes, head):
                    writer.write(MISSING)
        except BAD_INPUT as exc:
            log.warning("stage copy request from %s failed: %r", remote, exc)
        finally:
            await close_after_sender(reader, writer)  # let the client read the end first

    def _newest(self, request: CopyRequest) -> tuple[int, str | None, Path] | None:
        """Our newest state of the stage we train that our plan may use, at the step asked or
        later, before the run's last."""
        plan, spec, directory = self._states.plan, self._states.spec, self._states.directory
        if plan is None or spec is None or directory is None:
            return None
        role = plan.role_of(self._me)
        if role is None or request.layers != plan.layer_ranges(spec.model.n_layer)[role.stage]:
            return None
        key = layers_key(request.layers)
        usable = [
            (s.step, -rank, written(s)[0], s)
            for s in list_states(directory)
            if s.key == key
            and request.min_step <= s.step < spec.optim.steps
            and (rank := plan.state_rank(s.tag)) is not None
        ]
        if not usable:
            return None
        # the plan's own tag first, then the later epoch (as the writer orders them)
        _, _, _, newest = max(usable, key=lambda found: found[:3])
        return newest.step, newest.tag, newest.path
