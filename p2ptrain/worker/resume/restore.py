"""Loading this peer's stage at a new plan's agreed start (worker/resume/start_step.py): from its own
checkpoint directory, else fetched from a member that announced the agreed digest
(worker/resume/state_transfer.py), else, for a plan that cuts the model anew, built from the agreed
states of other layer ranges (worker/resume/covers.py, train/recut.py), each local or fetched.

Only states of the plan's lineage or its ancestors' count (records/lineage.py): a local state
saved under another lineage (the other side of a healed partition) is never resumed from, and
a warning says so. When the stages share no step (start_choice.py), a stage with no state at
the agreed step resumes from the state agreed for it instead (StartPoint.steps: its newest
before, else its oldest after; under diloco the replicas drift apart once a round fails, and the
stage's holder may have run past the others' newest state and pruned its older ones), local or
fetched from whoever holds it, a spare included (a few steps replayed, nothing lost). A stage
no member holds any state of restarts from initial weights: the run goes on, but that stage's
training is lost, so the worker says it loudly (STAGE STATE LOST). Our own state that does not
load (a torn write) is set aside; the agreed state is fetched from another holder, else our next
older state is loaded (this stage loses the steps between, not all of them).
A restarted swarm's first plan may adopt an earlier lineage's states (worker/resume/adopt.py): those
this machine holds are first linked under the plan's tag, then loaded like its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from p2ptrain.records import Plan, RunSpec
from p2ptrain.records.lineage import may_adopt
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import layers_key, list_states, stamped_path
from p2ptrain.train.checkpoint_read import load_stage, other_run, read_state
from p2ptrain.train.model import Stage
from p2ptrain.train.recut import assemble
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_bounds import expected_state_bytes, expected_state_tensors
from p2ptrain.worker.resume.adopt import link_adopted
from p2ptrain.worker.resume.covers import key_range
from p2ptrain.worker.resume.own_states import StateRank, local_states
from p2ptrain.worker.resume.start_choice import StartPoint
from p2ptrain.worker.resume.state_fetch import fetch_state, tell_held

if TYPE_CHECKING:  # hivemind is imported only by the worker: tests of restoring run beside libp2p
    from p2ptrain.worker.pipeline.transport import Transport

log = logging.getLogger("p2ptrain.worker")


def warn_other_lineages(directory: Path, rank: StateRank, key: str, step: int) -> None:
    """Say why local states of stage `key` newer than `step`, saved under another lineage, are
    not resumed from."""
    other = [
        s for s in list_states(directory) if s.key == key and s.step > step and rank(s.tag) is None
    ]
    if other:
        log.warning(
            "not resuming layers %s from local states at steps %s: they were saved under plan "
            "lineage %s, which the current plan does not descend from (the other side of a "
            "partition, or an earlier swarm's while this one has its own): their training is "
            "dropped; the files stay",
            key,
            sorted({s.step for s in other}),
            ", ".join(sorted({s.tag or "root" for s in other})),
        )


@dataclass(frozen=True)
class Restored:
    """Where a stage starts: the step to train next, and, when no member held its state in a
    run under way (STAGE STATE LOST: it restarts from initial weights), its layers key."""

    step: int
    lost: str | None = None


def restore_stage(
    spec: RunSpec,
    plan: Plan,
    transport: Transport,
    directory: Path,
    model: Stage,
    optimizer: torch.optim.Optimizer,
    start: StartPoint,
    outer_state: dict[str, torch.Tensor] | None = None,
) -> Restored:
    """Load `model`'s state at the agreed step (fetching it from a member that holds it if this
    machine does not): the step to train next, and whether the stage's state was lost.
    `outer_state` gets the state's DiLoCo tensors, if it has them
    (worker/averaging/outer_rounds.py)."""
    if start.note:
        log.warning("resuming at step %d: %s", start.step, start.note)
    layers, rank = model.layers, plan.state_rank
    key = layers_key(layers)
    if start.adopted:
        link_adopted(directory, start.adopted, start.state_step, start.digests, plan.state_tag)
    state_step = start.state_step(key)
    if state_step not in local_states(directory, rank).get(key, {}):
        missing = _Missing(spec, plan, transport, directory, start)
        if key in start.sources:
            missing.build(model, optimizer)
        else:
            missing.fetch(layers, model, optimizer)
    release_donors(plan, transport, start, (key, *start.sources.get(key, ())))
    warn_other_lineages(directory, rank, key, start.step)
    local = local_states(directory, rank).get(key, {})
    usable = sorted(step for step in local if step <= start.step)
    if key in start.steps and state_step in local:  # the state agreed for this stage
        usable = [state_step]
    if not usable and key not in start.digests and key not in start.sources:
        # no state of this stage at the agreed step anywhere (its holders ran ahead of the
        # others': diloco's replicas drift apart after a failed round, further than the kept
        # history): its own oldest newer state costs a few replayed steps, initial weights all
        usable = sorted(step for step in local if step > start.step)[:1]
    if not usable:
        if start.step > 0:  # the run goes on, but this stage's training is lost: say it loudly
            log.warning(
                "STAGE STATE LOST: no member of plan term %d epoch %d holds a state of layers "
                "%s (its only holder left or lost its files): they restart from initial weights "
                "at step %d while the other stages resume",
                plan.term,
                plan.epoch,
                key,
                start.step,
            )
        return Restored(start.step, key if start.step > 0 else None)
    path = local[usable[-1]].path
    try:
        loaded = load_stage(path, spec, model, optimizer, outer_state)
    except Exception as exc:  # torn, corrupt or foreign: the worker goes on without it
        older = [local[step].path for step in sorted(local, reverse=True) if step < usable[-1]]
        missing = _Missing(spec, plan, transport, directory, start)
        found = _unloadable(path, exc, missing, older, model, optimizer, outer_state)
        if found is None:
            return Restored(start.step, key if start.step > 0 else None)
        loaded, path = found
    if loaded != start.step:
        log.warning("layers %s resumed from step %d for step %d", key, loaded, start.step)
    log.info("resumed layers %s at step %d from %s", key, start.step, path)
    return Restored(start.step)


def _unloadable(
    path: Path,
    exc: Exception,
    missing: _Missing,
    older: list[Path],
    model: Stage,
    optimizer: torch.optim.Optimizer,
    outer_state: dict[str, torch.Tensor] | None,
) -> tuple[int, Path] | None:
    """Our own state file at `path` did not load (a torn write, another run's or version's
    file): set it aside (`.unloadable`, for the operator) and fetch the agreed state from
    another holder, else load the first of our `older` states (newest first) that loads, each
    that does not set aside too: the step loaded and its file. None, said loudly, if neither
    (the stage starts from initial weights). It used to end the worker, at every restart, and
    then to drop the stage's training though older states of it lay on disk."""
    _set_aside(path, exc)
    spec = missing.spec
    fetched = missing.fetch(model.layers)
    if fetched is not None:
        return load_stage(fetched, spec, model, optimizer, outer_state), fetched
    for candidate in older:
        try:
            return load_stage(candidate, spec, model, optimizer, outer_state), candidate
        except Exception as again:  # as torn: the next older one
            _set_aside(candidate, again)
    log.warning(
        "STAGE STATE LOST: no other member gave layers %s and no older state of them here "
        "loads: they start from initial weights",
        layers_key(model.layers),
    )
    return None


def _set_aside(path: Path, exc: Exception) -> None:
    aside = path.with_name(path.name + ".unloadable")
    log.warning("cannot load %s (%s): set aside as %s", path.name, exc, aside.name)
    with contextlib.suppress(OSError):
        path.replace(aside)


def start_lineage(plan: Plan, start: StartPoint) -> str:
    """The lineage id of the state a plan resumed from ("root": untagged states; "": it
    started from initial weights), as metrics reports carry it."""
    if start.adopted or not start.step:
        return start.adopted
    return plan.lineage[0][0] if plan.lineage else "root"


def started_line(
    spec: RunSpec, plan: Plan, start: StartPoint, directory: Path, lost: str | None = None
) -> str:
    """Where the plan started, as the organiser reads it (every node's log, `status`): which
    step of which lineage it resumed from, and a restarted swarm that adopted an earlier
    swarm's state, or did not because the run says resume = "never", says so loudly; a stage
    whose state was lost (`lost`: Restored's) says that, not "resumed"."""
    if lost:
        return f"started from initial weights at step {start.step}: layers {lost} were lost"
    if start.adopted:
        line = f"resumed from step {start.step} (lineage {start.adopted})"
        log.warning("%s: the newest state of run %s, saved by an earlier swarm", line, spec.run_id)
        return line
    if start.step:
        return f"resumed from step {start.step} (lineage {start_lineage(plan, start)})"
    if spec.checkpoint.resume == "never" and may_adopt(plan.lineage):
        found = [s.step for s in list_states(directory) if other_run(s.path, spec) is None]
        line = 'resume = "never": started from initial weights'
        if found:
            line += f" (this machine holds states of the run up to step {max(found)}: not used)"
        log.warning("%s", line)
        return line
    return "started from initial weights"


def release_donors(
    plan: Plan, transport: Transport, start: StartPoint, keys: tuple[str, ...]
) -> None:
    """A spare that holds a state we need first of its holders waits for us to fetch it (a
    donor: worker/resume/handover.py, `owed`), up to the hand-over's limit. We have it by now,
    from it or locally (a copy, an older file of the same bytes), or will not fetch it: it is
    told, so that it stops as soon as its other takers have theirs."""
    me = transport.peer_id
    told: dict[str, list[tuple[range, int, str]]] = {}
    for key in keys:
        step, digest, layers = start.state_step(key), start.digests.get(key), key_range(key)
        holders = start.holders(key, step)
        if digest is None or layers is None or not holders or me in holders:
            continue
        if holders[0] in plan.spares:
            told.setdefault(holders[0], []).append((layers, step, digest))
    for spare, states in told.items():
        try:
            tell_held(transport, spare, states)  # not waited for
        except Exception as exc:  # it waits its limit out: slower, nothing lost
            log.info("could not tell %s this peer holds its states: %r", spare, exc)


@dataclass(frozen=True)
class _Missing:
    """A stage state this machine lacks at the agreed step: where it comes from under `plan`."""

    spec: RunSpec
    plan: Plan
    transport: Transport
    directory: Path
    start: StartPoint

    def build(self, model: Stage, optimizer: torch.optim.Optimizer) -> None:
        """Build `model`'s state at the agreed step from the agreed states of other layer
        ranges (start.sources), fetching those this machine lacks, and save it as this stage's
        state under the plan's lineage tag (so restore_stage loads it, and other members may
        fetch it)."""
        spec, plan, directory, start = self.spec, self.plan, self.directory, self.start
        key = layers_key(model.layers)
        pieces = []
        for source in start.sources[key]:
            layers = key_range(source)
            assert layers is not None  # covers.py names valid ranges only
            saved = local_states(directory, plan.state_rank).get(source, {}).get(start.step)
            found = saved.path if saved is not None else self.fetch(layers)
            if found is None:
                log.warning(
                    "cannot build layers %s: no holder of %s at step %d answered",
                    key,
                    source,
                    start.step,
                )
                return
            try:
                pieces.append((layers, read_state(found, spec, layers)))
            except Exception as exc:  # a bad file: the stage cannot be built from it
                log.warning("cannot build layers %s from %s: %r", key, found.name, exc)
                return
        outer = assemble(spec, model, optimizer, pieces, partial=key in start.fresh)
        snapshot = StageSnapshot.take(model, optimizer, start.step, outer)
        rank = plan.state_rank
        record_step(directory, spec, model, snapshot, plan.state_tag, lambda t: rank(t) is not None)
        sources = ", ".join(start.sources[key])
        fresh = start.fresh.get(key)
        lacking = f" (blocks {', '.join(map(str, fresh))} from initial weights)" if fresh else ""
        log.info("built layers %s at step %d from %s%s", key, start.step, sources, lacking)

    def fetch(
        self,
        layers: range,
        model: Stage | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> Path | None:
        """Copy the agreed state of `layers` (at the agreed step, or the stage's own agreed step:
        StartPoint.steps) from a member that announced its agreed digest, under the plan's
        lineage tag; bytes of another digest, or more than the stage's
        size, are refused, and so is a file that does not load into `model` (if given: else it
        is validated as read_state does). The path, or None if no holder gave it."""
        spec, plan, transport, start = self.spec, self.plan, self.transport, self.start
        key = layers_key(layers)
        digest = start.digests.get(key)
        if digest is None:
            return None
        max_bytes = expected_state_bytes(spec, layers)
        max_tensors = expected_state_tensors(spec, layers)
        step = start.state_step(key)
        for peer in start.holders(key, step):
            if peer == transport.peer_id:
                continue
            started_s = time.monotonic()
            log.info(
                "fetching layers %s (step %d, up to %.0f MB) from %s",
                key,
                step,
                max_bytes / 1e6,
                peer,
            )
            try:
                path = fetch_state(
                    transport,
                    peer,
                    layers,
                    step,
                    self.directory,
                    digest,
                    max_bytes,
                    plan.link_facts(transport.peer_id, peer),
                    plan.state_tag,
                    max_tensors,
                )
                if model is not None:
                    load_stage(path, spec, model, optimizer)  # validates first
                else:
                    read_state(path, spec, layers)
            except Exception as exc:  # any failure, a bad file included: try the next holder
                log.warning("fetching layers %s from %s failed: %r", key, peer, exc)
                stamped_path(self.directory, layers, step, plan.state_tag).unlink(missing_ok=True)
                continue
            elapsed_s = time.monotonic() - started_s
            log.info("fetched %s from %s in %.1f s", path.name, peer, elapsed_s)
            return path
        return None
