"""What a member holds and announces to a plan's start agreement (worker/resume/start_step.py):
the stamped states of its checkpoint directory the plan may use, the announcement made of them
(layers key -> step -> (sha256, lineage tag)), and what of an announcement a plan may use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import written
from p2ptrain.train.checkpoint_folder import SavedState, list_states
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume import adopt
from p2ptrain.worker.resume.announcement import MAX_KEYS, MAX_STEPS_PER_KEY, Announced

Held = dict[str, dict[int, str]]  # layers key -> step -> sha256 (hex) of the state file
StateRank = Callable[[str | None], int | None]  # Plan.state_rank: None for another lineage's


def local_states(directory: Path, rank: StateRank) -> dict[str, dict[int, SavedState]]:
    """The stamped states of `directory` a plan may use (`rank`: its Plan.state_rank), one per
    stage and step: the one of the lineage closest to the plan's; of two of one lineage (a plan
    restarted the stage below steps it saved), the later epoch's, as the writer orders them
    (by tag, "X-e10" sorted before "X-e9")."""
    best: dict[str, dict[int, tuple[tuple[int, int], SavedState]]] = {}
    for state in list_states(directory):
        position = rank(state.tag)
        order = (position or 0, -written(state)[0])
        current = best.setdefault(state.key, {}).get(state.step)
        if position is not None and (current is None or order < current[0]):
            best[state.key][state.step] = (order, state)
    return {
        key: {step: s for step, (_, s) in steps.items()} for key, steps in best.items() if steps
    }


def own_announcement(
    directory: Path, rank: StateRank, spec: RunSpec | None = None, run: RunSpec | None = None
) -> Announced:
    """What this member announces: its usable states with their digests and lineage tags; with
    `spec` (the plan may adopt: worker/resume/adopt.py), its other lineages' states of that run
    too; with `run`, untagged states of that run only (adopt.announceable)."""
    found: Announced = {}
    states = adopt.announceable(directory, rank, spec, MAX_STEPS_PER_KEY, run)
    for key, steps in sorted(states.items())[:MAX_KEYS]:
        for step, state in steps.items():
            try:
                found.setdefault(key, {})[step] = (file_sha256(state.path), state.tag)
            except OSError:  # pruned meanwhile
                continue
    return found


def usable(announced: Announced, rank: StateRank) -> Held:
    """The states of an announcement a plan may use (`rank`: its Plan.state_rank)."""
    held: Held = {}
    for key, steps in announced.items():
        kept = {step: digest for step, (digest, tag) in steps.items() if rank(tag) is not None}
        if kept:
            held[key] = kept
    return held
