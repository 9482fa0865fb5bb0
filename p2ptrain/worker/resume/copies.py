"""Spares keep copies of the stages only one peer holds, so that a crash costs steps, not a stage.

In a plan of one pipeline each stage's state lives on its holder alone. A holder that stops
gracefully hands its stage over (control/handover.py); one that crashes (SIGKILL, the OOM killer,
a power cut) took the stage's training with it, and the next plan restarted that stage from
initial weights (STAGE STATE LOST). So while such a plan trains, its first spares copy the
holders' newest saved states, stage i to the spares at positions i and i + stages of the plan's
spare list (COPIES_PER_STAGE), every `spare_copy_interval_s` (run spec) at most, and never more
often than a copy taking a tenth of the link between them (`copy_gap_s`). A copy is an ordinary
stamped checkpoint file of the spare, under the plan's lineage: the next plan's start agreement
hears of it like any state the spare holds (start_step.py), and a stage whose holder crashed
resumes from it ("resumed from step N", the steps since the copy trained again).

Protocol `p2ptrain.stage-copy.v1`: the client sends a 4-byte big-endian length and a JSON request
`{"layers": "L<a>-<b>", "min_step": N}` (≤ 256 bytes, `CopyRequest`); the server answers one status
byte (FOUND, MISSING or BUSY, as stage-state.v3) and, if found, the state's step (8 bytes,
big-endian) and sha256 (32 bytes), then the file's size and bytes as stage-state.v3 sends them:
its newest state of those layers saved under the current plan at step N or later.

Who is served (docs/security.md, 34.1): the current plan's spares only (anyone else: MISSING,
nothing parsed), for the stage this worker trains, one copy a spare per half its gap (else BUSY),
within the state server's caps on streams (state_transfer.py). The client keeps the bytes only if
they are a state of format /3 within the stage's bounds whose sha256 is the one announced, at a
step after its own newest and within the run, and if they load as a state of those layers
(train/checkpoint_read.py): a hostile holder can make a copy wrong, which its own state already
is (the holder alone decides its stage: "Not defended yet", 4b), nothing more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2ptrain.errors import WireError
from p2ptrain.records import LinkFacts, Plan, RunSpec
from p2ptrain.records import fields as f
from p2ptrain.train.checkpoint import (
    expected_state_bytes,
    expected_state_tensors,
    file_sha256,
    layers_key,
    list_states,
    prune_history,
    stamped_path,
)
from p2ptrain.train.checkpoint_read import read_state
from p2ptrain.worker.inbound import BAD_INPUT, close_after_sender, read_prefixed
from p2ptrain.worker.resume.copy_sources import record_copy
from p2ptrain.worker.resume.state_fetch import receive_file
from p2ptrain.worker.resume.state_transfer import (
    BUSY,
    FOUND,
    LOCAL_RATE_MBPS,
    LOCAL_RTT_S,
    MAX_REQUEST_BYTES,
    MAX_SERVING,
    MISSING,
    REQUEST_LEN,
    REQUEST_TIMEOUT_S,
    StateServer,
    parse_layers,
    transfer_deadline_s,
)

if TYPE_CHECKING:  # hivemind is imported only when used: tests of the rules run beside libp2p
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

    from p2ptrain.worker.pipeline.transport import Transport

log = logging.getLogger(__name__)

COPY_PROTOCOL = "p2ptrain.stage-copy.v1"
HEAD = struct.Struct(">Q32s")  # the state's step and sha256
COPIES_PER_STAGE = 2  # spares copying one stage: one may be a donor about to leave, or crash too
LINK_SHARE = 0.1  # a copy's share of the link between spare and holder, at most
FIRST_TRY_S = 5.0  # between asks until the first copy
_REQUEST = "stage copy request"


@dataclass(frozen=True)
class CopyRequest:
    """What a spare asks a holder for: its newest state of `layers` at `min_step` or later."""

    layers: range
    min_step: int

    def to_dict(self) -> dict[str, Any]:
        return {"layers": layers_key(self.layers), "min_step": self.min_step}

    def encode(self) -> bytes:
        data = json.dumps(self.to_dict(), separators=(",", ":")).encode()
        return REQUEST_LEN.pack(len(data)) + data

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
        if len(body) > MAX_REQUEST_BYTES:
            raise WireError(f"oversized {_REQUEST}: {len(body)} bytes")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, a 5000-digit integer
            raise f.malformed(_REQUEST, "not JSON") from None
        return cls.from_dict(data)


def copy_duty(plan: Plan, me: str, n_layer: int) -> tuple[range, str] | None:
    """The layers this spare keeps a copy of, and their holder: None unless the plan is one
    pipeline (a stage with replicas has its copies) and `me` is among its first spares."""
    if len(plan.pipelines) != 1 or me not in plan.spares:
        return None
    holders = plan.pipelines[0]
    position = plan.spares.index(me)
    if position >= COPIES_PER_STAGE * len(holders):
        return None
    stage = position % len(holders)
    return plan.layer_ranges(n_layer)[stage], holders[stage]


def copy_gap_s(spec: RunSpec, size_bytes: int, links: LinkFacts | None) -> float:
    """Seconds between two copies of a state of `size_bytes` over `links`: the run's interval,
    or longer where a copy would take more than LINK_SHARE of the link."""
    rate_mbps = LOCAL_RATE_MBPS if links is None else links.rate_mbps
    moving_s = size_bytes * 8 / (rate_mbps * 1e6)
    return max(spec.checkpoint.spare_copy_interval_s, moving_s / LINK_SHARE)


def newest_step(directory: Path, layers: range, plan: Plan) -> int:
    """The newest step of `layers` this directory holds that `plan` may use (-1: none)."""
    key = layers_key(layers)
    steps = [
        s.step
        for s in list_states(directory)
        if s.key == key and plan.state_rank(s.tag) is not None
    ]
    return max(steps, default=-1)


class CopyServer:
    """Answers the current plan's spares with this worker's newest saved state of its stage."""

    def __init__(self, states: StateServer, me: str, transport: Transport | None) -> None:
        self._states = states  # its plan, run, directory, network, caps and refusals
        self._me = me
        self._last_s: dict[str, float] = {}  # when each spare was last sent a copy
        self._plan_key: tuple[int, int] | None = None
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
        with self._states.streams.serving(remote):
            await self.serve(remote, reader, writer)

    def refusal(self, remote: str) -> bytes | None:
        """The answer to a request of `remote` not to be served at all, or None."""
        plan, spec = self._states.plan, self._states.spec
        if plan is None or spec is None or remote not in plan.spares:
            return MISSING  # only the current plan's spares keep copies
        if not spec.checkpoint.spare_copy_interval_s:
            return MISSING
        if plan.key != self._plan_key:  # a new plan: its spares start afresh
            self._plan_key, self._last_s = plan.key, {}
        states = self._states.streams
        if states.of(remote) or states.total() >= MAX_SERVING:
            return BUSY
        return None

    async def serve(
        self, remote: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read `remote`'s request and send it the newest state it asks for, if it may have it."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S + 4 * LOCAL_RTT_S):
                request = CopyRequest.decode(
                    await read_prefixed(reader, REQUEST_LEN, MAX_REQUEST_BYTES, _REQUEST)
                )
            found = self._newest(request)
            max_bytes = self._states.max_bytes(request.layers)
            if found is None or max_bytes is None:
                writer.write(MISSING)
                return
            step, path = found
            plan, spec = self._states.plan, self._states.spec
            assert plan is not None and spec is not None
            gap_s = copy_gap_s(spec, path.stat().st_size, plan.link_facts(self._me, remote))
            if time.monotonic() - self._last_s.get(remote, -gap_s) < gap_s / 2:
                writer.write(BUSY)  # it asked again too soon: a copy costs our uplink
                return
            digest = await asyncio.to_thread(file_sha256, path)  # usually cached
            head = FOUND + HEAD.pack(step, bytes.fromhex(digest))
            self._last_s[remote] = time.monotonic()
            if not await self._states.send_file(remote, writer, path, max_bytes, head):
                writer.write(MISSING)
        except BAD_INPUT as exc:
            log.warning("stage copy request from %s failed: %r", remote, exc)
        finally:
            await close_after_sender(reader, writer)  # let the client read the end first

    def _newest(self, request: CopyRequest) -> tuple[int, Path] | None:
        """Our newest state of the layers asked, saved under the current plan, at the step
        asked or later: only of the stage we train (what a copy is for)."""
        plan, spec, directory = self._states.plan, self._states.spec, self._states.directory
        if plan is None or spec is None or directory is None:
            return None
        role = plan.role_of(self._me)
        ranges = plan.layer_ranges(spec.model.n_layer)
        if role is None or request.layers != ranges[role.stage]:
            return None
        key, tag = layers_key(request.layers), plan.state_tag
        newer = [
            s
            for s in list_states(directory)
            if s.key == key and s.tag == tag and request.min_step <= s.step <= spec.optim.steps
        ]
        if not newer:
            return None
        newest = max(newer, key=lambda s: s.step)
        return newest.step, newest.path


def keep_copies(
    spec: RunSpec,
    plan: Plan,
    transport: Transport,
    directory: Path,
    superseded: Callable[[float], bool],
) -> None:
    """A spare's copies for as long as its plan stands: `superseded(s)` waits up to `s` seconds
    and says whether the plan is over (a newer one, or a stop)."""
    me = transport.peer_id
    duty = copy_duty(plan, me, spec.model.n_layer)
    if duty is None or not spec.checkpoint.spare_copy_interval_s:
        return
    layers, holder = duty
    links = plan.link_facts(me, holder)
    gap_s = copy_gap_s(spec, expected_state_bytes(spec, layers), links)
    log.info(
        "keeping a copy of layers %s, which %s alone holds: one every %.0f s at most",
        layers_key(layers),
        holder,
        gap_s,
    )
    copied_any, failures = False, 0
    while True:
        copied = copy_once(spec, plan, transport, directory, layers, holder, failures)
        failures = 0 if copied is not None else failures + 1
        copied_any = copied_any or bool(copied)
        # until the first copy, ask sooner: the holder saves its first state a few steps in
        if superseded(gap_s if copied_any else min(gap_s, FIRST_TRY_S)):
            return


def copy_once(
    spec: RunSpec,
    plan: Plan,
    transport: Transport,
    directory: Path,
    layers: range,
    holder: str,
    failures: int = 0,
) -> bool | None:
    """Fetch `holder`'s newest state of `layers` if it is newer than ours: True if one was
    kept, False if the holder had none newer for us, None if the try failed (`failures`: how
    many in a row before it; the 1st and every 10th are logged)."""
    ours = newest_step(directory, layers, plan)
    max_bytes = expected_state_bytes(spec, layers)
    links = plan.link_facts(transport.peer_id, holder)
    started_s = time.monotonic()
    try:
        copied = transport.call(
            _fetch_copy(transport, holder, CopyRequest(layers, ours + 1), spec, plan, directory),
            timeout_s=transfer_deadline_s(max_bytes, links) + 10,
        )
    except Exception as exc:  # the holder gone, slow, or sending what we refuse
        if failures % 10 == 0:
            log.warning("copying layers %s from %s failed: %r", layers_key(layers), holder, exc)
        return None
    if copied is None:
        return False
    step, path = copied
    try:
        read_state(path, spec, layers)  # validated as a resume would load it
    except Exception as exc:
        log.warning("the copy of layers %s from %s is refused: %s", layers_key(layers), holder, exc)
        path.unlink(missing_ok=True)
        return None
    record_copy(directory, path, holder)  # announced only once the holder is gone
    prune_history(directory, layers_key(layers), step, plan.state_tag, _usable(plan))  # as a save
    log.info(
        "copied layers %s at step %d from %s (%d kB in %.1f s)",
        layers_key(layers),
        step,
        holder,
        path.stat().st_size // 1000,
        time.monotonic() - started_s,
    )
    return True


async def _fetch_copy(
    transport: Transport,
    holder: str,
    request: CopyRequest,
    spec: RunSpec,
    plan: Plan,
    directory: Path,
) -> tuple[int, Path] | None:
    """One request: the step and path of the copy kept, or None if the holder has none newer
    for us now (MISSING, BUSY)."""
    from hivemind.p2p import PeerID

    layers = request.layers
    max_bytes = expected_state_bytes(spec, layers)
    what = f"{holder}'s copy of {layers_key(layers)}"
    deadline_s = transfer_deadline_s(max_bytes, plan.link_facts(transport.peer_id, holder))
    async with asyncio.timeout(deadline_s):
        _, reader, writer = await transport.p2p.call_binary_stream_handler(
            PeerID.from_base58(holder), COPY_PROTOCOL
        )
        try:
            body = request.encode()
            writer.write(body)
            await writer.drain()
            transport.traffic.sent(holder, len(body))
            return await receive_copy(
                reader,
                request,
                spec,
                plan,
                directory,
                what,
                on_bytes=lambda n: transport.traffic.received(holder, n),
            )
        finally:
            writer.close()


async def receive_copy(
    reader: asyncio.StreamReader,
    request: CopyRequest,
    spec: RunSpec,
    plan: Plan,
    directory: Path,
    what: str,
    on_bytes: Callable[[int], None] | None = None,
) -> tuple[int, Path] | None:
    """Read a copy's reply into `directory`, under the plan's lineage: (step, path) of the file
    kept, None for MISSING or BUSY; WireError for a step before the one asked or past the
    run, and what `receive_file` refuses."""
    status = await reader.readexactly(1)
    if status != FOUND:
        return None
    step, digest = HEAD.unpack(await reader.readexactly(HEAD.size))
    if not request.min_step <= step <= spec.optim.steps:
        raise WireError(f"{what}: step {step}, asked for one from {request.min_step}")
    layers = request.layers
    target = stamped_path(directory, layers, step, plan.state_tag)
    if target.exists():  # a state we hold is never overwritten
        raise WireError(f"{what}: step {step} is held here already")
    max_bytes = expected_state_bytes(spec, layers)
    tensors = expected_state_tensors(spec, layers)
    await receive_file(reader, target, digest.hex(), max_bytes, what, on_bytes, tensors)
    return step, target


def _usable(plan: Plan) -> Callable[[str | None], bool]:
    return lambda tag: plan.state_rank(tag) is not None
