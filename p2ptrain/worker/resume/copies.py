"""Spares keep copies of the stages only one peer holds, so that a crash costs steps, not a stage.

In a plan of one pipeline each stage's state lives on its holder alone. A holder that stops
gracefully hands its stage over (control/handover.py); one that crashes (SIGKILL, the OOM killer,
a power cut) took the stage's training with it, and the next plan restarted that stage from
initial weights (STAGE STATE LOST). So while such a plan trains, its spares copy the holders'
newest saved states: stage j to the spare at position j modulo the number of spares in the
plan's spare list (`copy_duties`: one copier a stage, so two copies at different steps never
contest each other in the start agreement), one copy every `spare_copy_interval_s` (run spec)
at most, and never more often than a copy taking a tenth of the link between them
(`copy_gap_s`). A copy is an ordinary stamped checkpoint file of the spare, under the tag the
holder saved it under; `copies.json` says whose copy it is (copy_sources.py). The next plan's
start agreement hears of it only once its holder is out of the plan, and the stage then resumes
from it (start_step.py): the steps since the copy are trained again.

The protocol, and who the holder serves: worker/resume/copy_server.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.errors import WireError
from p2ptrain.records import CopyReport, Plan, RunSpec, StageCopy
from p2ptrain.records.lineage import parse_tag
from p2ptrain.records.peer import MAX_COPIES
from p2ptrain.train.checkpoint import prune_history
from p2ptrain.train.checkpoint_folder import SavedState, layers_key, list_states, stamped_path
from p2ptrain.train.checkpoint_read import read_state
from p2ptrain.train.state_bounds import expected_state_bytes, expected_state_tensors
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume.copy_server import (
    COPY_PROTOCOL,
    HEAD,
    MAX_TAG,
    CopyRequest,
    Duty,
    copies_on,
    copy_duties,
    copy_gap_s,
)
from p2ptrain.worker.resume.copy_sources import drop_copies, read_sources, record_copy
from p2ptrain.worker.resume.start_choice import StartPoint
from p2ptrain.worker.resume.state_fetch import receive_file
from p2ptrain.worker.resume.state_transfer import FOUND, transfer_deadline_s

if TYPE_CHECKING:  # hivemind is imported only when used: tests of the rules run beside libp2p
    from p2ptrain.worker.pipeline.transport import Transport

log = logging.getLogger(__name__)

FIRST_TRY_S = 5.0  # between asks until the first copy: the holder saves a few steps in
CHECK_S = 0.5  # how often a copy under way looks whether its plan is over


def next_step(directory: Path, duty: Duty, plan: Plan) -> int:
    """The step to ask the holder for copies from: after our newest copy of its (0: none)."""
    layers, holder = duty
    sources = read_sources(directory)
    steps = [
        s.step
        for s in list_states(directory)
        if s.key == layers_key(layers)
        and sources.get(s.path.name) == holder
        and plan.state_rank(s.tag) is not None
    ]
    return max(steps, default=-1) + 1


def copy_notes(directory: Path, duties: list[Duty], plan: Plan) -> tuple[StageCopy, ...]:
    """Each duty with the step of our newest copy of it (None: none yet), MAX_COPIES at most."""
    notes = []
    for duty in duties[:MAX_COPIES]:
        layers, holder = duty
        newest = next_step(directory, duty, plan) - 1
        notes.append(StageCopy(layers.start, layers.stop, holder, newest if newest >= 0 else None))
    return tuple(notes)


def keep_copies(
    spec: RunSpec,
    plan: Plan,
    transport: Transport,
    directory: Path,
    superseded: Callable[[float], bool],
    start: StartPoint | None,
    report: Callable[[CopyReport], None],
) -> None:
    """A spare's copies for as long as its plan stands: `superseded(s)` waits up to `s` seconds
    and says whether the plan is over (a newer one, or a stop). `start`: what the plan's start
    agreement chose (None: it failed). `report` gets the duties and their newest copies' steps
    (`status` shows them), at the start and after each copy. A spare's copies are its newest states, so a stale one,
    announced once its holder is gone, would contest the stage's newer states at a restart
    (covers.py): copies of other stages or holders go, those of a holder gone from the plan
    that the start did not take at once, the rest once the stage's copier had time for its
    own (`drop_stale`)."""
    me = transport.peer_id
    duties = copy_duties(plan, me, spec.model.n_layer) if copies_on(spec) else []
    gaps = {
        duty: copy_gap_s(spec, expected_state_bytes(spec, duty[0]), plan.link_facts(me, duty[1]))
        for duty in duties
    }
    for (layers, holder), gap_s in gaps.items():
        log.info(
            "keeping a copy of layers %s, which %s alone holds: one every %.0f s at most",
            layers_key(layers),
            holder,
            gap_s,
        )
    if start is None:  # the plan never started: what we hold may be all the swarm has
        drop_at = None
    else:
        drop_stale(directory, plan, start, duties, spec, at_once=True)
        drop_at = time.monotonic() + stale_after_s(spec, plan)
    due = dict.fromkeys(duties, time.monotonic())

    def report_copies() -> None:
        report(CopyReport(copy_notes(directory, duties, plan), plan.term, plan.epoch))

    report_copies()
    copied_once: set[Duty] = set()
    failures = dict.fromkeys(duties, 0)
    while due or drop_at is not None:
        if drop_at is not None and drop_at <= time.monotonic():
            assert start is not None
            drop_stale(directory, plan, start, duties, spec, at_once=False)
            drop_at = None
        for duty in [d for d, at in due.items() if at <= time.monotonic()]:
            if superseded(0.0):
                return
            copied = copy_once(spec, plan, transport, directory, duty, superseded, failures[duty])
            failures[duty] = 0 if copied is not None else failures[duty] + 1
            if copied:
                copied_once.add(duty)
                report_copies()
            wait_s = gaps[duty] if duty in copied_once else min(gaps[duty], FIRST_TRY_S)
            due[duty] = time.monotonic() + wait_s
        wake_at = min([*due.values(), *([drop_at] if drop_at is not None else [])], default=0.0)
        if superseded(max(0.0, wake_at - time.monotonic())):
            return


def stale_after_s(spec: RunSpec, plan: Plan) -> float:
    """How long into a plan a spare keeps copies it no longer keeps up: the stage's new copier
    has had two gaps and a transfer for its own by then."""
    ranges = plan.layer_ranges(spec.model.n_layer)
    biggest = max(expected_state_bytes(spec, r) for r in ranges)
    slowest = plan.network.swarm if plan.network is not None else None
    return 2 * copy_gap_s(spec, biggest, slowest) + transfer_deadline_s(biggest, plan.network)


def drop_stale(
    directory: Path,
    plan: Plan,
    start: StartPoint,
    duties: list[Duty],
    spec: RunSpec,
    at_once: bool,
) -> None:
    """Delete our copies other than our duties': `at_once`, only those of a holder gone from
    the plan that the plan's start did not take (others hold newer states of those layers);
    later, every one of them."""
    keep = {(layers_key(layers), holder) for layers, holder in duties}
    members = plan.peers()

    def stays(state: SavedState, holder: str) -> bool:
        if (state.key, holder) in keep:
            return True
        if not at_once:
            return False
        return holder in members or start.digests.get(state.key) == _sha(state)  # taken

    try:
        gone = drop_copies(directory, stays)
    except OSError as exc:
        log.warning("dropping old copies failed: %r", exc)
        return
    if gone:
        log.info("dropped %d copies of stages this spare no longer copies", gone)


def _sha(state: SavedState) -> str | None:
    try:
        return file_sha256(state.path)
    except OSError:
        return None


def copy_once(
    spec: RunSpec,
    plan: Plan,
    transport: Transport,
    directory: Path,
    duty: Duty,
    superseded: Callable[[float], bool],
    failures: int = 0,
) -> bool | None:
    """Fetch the holder's newest state of the duty's layers if it is newer than our copies:
    True if one was kept, False if it had none newer for us, None if the try failed or the
    plan ended meanwhile (`failures`: tries failed in a row before; the 1st and every 10th
    failure are logged)."""
    layers, holder = duty
    started_s = time.monotonic()
    try:
        request = CopyRequest(layers, next_step(directory, duty, plan))
        links = plan.link_facts(transport.peer_id, holder)
        deadline_s = started_s + transfer_deadline_s(expected_state_bytes(spec, layers), links)
        future = transport.submit(_fetch_copy(transport, duty, request, spec, plan, directory))
        while True:  # a new plan or a stop does not wait for a copy under way
            try:
                copied = future.result(timeout=CHECK_S)
                break
            except FutureTimeout:
                if superseded(0.0) or time.monotonic() > deadline_s:
                    future.cancel()  # a file being validated never lands (receive_file)
                    return None
        if copied is None:
            return False
        prune_history(directory, copied.key, copied.step, copied.tag, _usable(plan), spec)
        if not copied.path.exists():  # older than the history this spare keeps of it
            raise WireError(f"step {copied.step} is older than the states kept of it")
        size_kb = copied.path.stat().st_size // 1000
    except Exception as exc:  # the holder gone or slow, what it sent refused, a full disk
        if failures % 10 == 0:
            log.warning("copying layers %s from %s failed: %r", layers_key(layers), holder, exc)
        return None
    log.info(
        "copied layers %s at step %d from %s (%d kB in %.1f s)",
        copied.key,
        copied.step,
        holder,
        size_kb,
        time.monotonic() - started_s,
    )
    return True


async def _fetch_copy(
    transport: Transport,
    duty: Duty,
    request: CopyRequest,
    spec: RunSpec,
    plan: Plan,
    directory: Path,
) -> SavedState | None:
    """One request: the copy kept, or None if the holder has none newer for us now (MISSING,
    BUSY)."""
    from hivemind.p2p import PeerID

    layers, holder = duty
    max_bytes = expected_state_bytes(spec, layers)
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
                holder,
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
    holder: str,
    on_bytes: Callable[[int], None] | None = None,
) -> SavedState | None:
    """Read `holder`'s reply into `directory`: the copy kept, None for MISSING
    or BUSY; WireError for a step before the one asked or not before the run's last, a tag
    our plan may not use, a state we hold already, and what `receive_file` refuses."""
    what = f"{holder}'s copy of {layers_key(request.layers)}"
    status = await reader.readexactly(1)
    if status != FOUND:
        return None
    step, digest, tag_len = HEAD.unpack(await reader.readexactly(HEAD.size))
    if tag_len > MAX_TAG:
        raise WireError(f"{what}: a tag of {tag_len} bytes")
    tag = (await reader.readexactly(tag_len)).decode("ascii", "replace") or None
    parsed = None if tag is None else parse_tag(tag)
    if tag is not None and (
        parsed is None or tag != f"{parsed[0]}-e{parsed[1]}" or plan.state_rank(tag) is None
    ):  # one name per tag: "-e05" beside "-e5" would be a second file of one step
        raise WireError(f"{what}: tag {tag!r} is not of this plan's lineage")
    if not request.min_step <= step < spec.optim.steps:
        raise WireError(f"{what}: step {step}, asked for one from {request.min_step}")
    layers = request.layers
    target = stamped_path(directory, layers, step, tag)
    if target.exists():  # a state we hold is never overwritten
        raise WireError(f"{what}: step {step} is held here already")
    directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (a local mkdir)
    record_copy(directory, target.name, holder)  # before the file: never taken for our own
    max_bytes = expected_state_bytes(spec, layers)
    tensors = expected_state_tensors(spec, layers)
    try:
        await receive_file(
            reader,
            target,
            digest.hex(),
            max_bytes,
            what,
            on_bytes,
            tensors,
            validate=lambda path: read_state(path, spec, layers),  # as a resume would load it
        )
    except BaseException:  # refused, cut short or cancelled: nothing landed
        record_copy(directory, target.name, None)
        raise
    return SavedState(layers_key(layers), step, tag, target)


def _usable(plan: Plan) -> Callable[[str | None], bool]:
    return lambda tag: plan.state_rank(tag) is not None
