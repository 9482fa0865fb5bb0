"""A restarted swarm adopts the run's newest state, whatever swarm saved it (issue 30).

When every peer of a run stops and a new swarm starts with the same run spec, its first plan
is a new lineage root (records/lineage.py), so the earlier swarm's states, tagged with its
lineages, are not the plan's. A plan whose lineage may adopt (`lineage.may_adopt`: no
ancestor) and that has no state of its own anywhere among its members (`spec.checkpoint.resume` =
"latest", the default) then takes the newest state of the run that its members hold or can
fetch, of one earlier lineage (states of two lineages are two trainings: never mixed):

- each member announces, besides the states the plan may use, its states of other lineages
  that are of this run (run id, model shape and data digest, read from the file: a state of
  another run in the same directory is never offered), the newest MAX steps of each stage;
- every member forms the same candidates (the plan's own usable states, then each other
  lineage's) and keeps the one with the newest complete start step (worker/resume/start_choice.py's
  `choose_start`), with the usual rules on whose announcements count, applied across lineages:
  a lone announcer's state counts only where no other member holds those blocks in any
  lineage (or the plan places it there), so a made-up lineage tag wins a member nothing;
- each member links the agreed states it holds under the plan's own tag (fetched ones arrive
  under it): from then on the plan's lineage has states, descends from the adopted one, and
  adopts nothing more. The other lineage's files stay where they were.

`resume = "never"` skips all of this: the swarm starts from initial weights and says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from p2ptrain.durable import link_into_place
from p2ptrain.errors import WireError
from p2ptrain.records.lineage import id_of_tag
from p2ptrain.records.run import RunSpec
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint import written
from p2ptrain.train.checkpoint_folder import SavedState, list_states, stamped_path
from p2ptrain.train.checkpoint_read import other_run
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume.covers import key_range

StateRank = Callable[[str | None], int | None]
Held = dict[str, dict[int, str]]  # layers key -> step -> sha256
Announced = dict[str, dict[int, tuple[str, str | None]]]  # key -> step -> (sha256, tag)
# the other lineages a member's announcement may put up for adoption: its newest few (an
# honest directory holds the run's last swarm's and perhaps a few before)
LINEAGES_PER_MEMBER = 4
FOREIGN = 1 << 20  # the rank of another lineage's state: after every state the plan may use


def announceable(
    directory: Path,
    rank: StateRank,
    spec: RunSpec | None,
    max_steps: int,
    run: RunSpec | None = None,
) -> dict[str, dict[int, SavedState]]:
    """The states of `directory` a member announces, one per stage and step, the newest
    `max_steps` steps of each stage: those the plan may use (`rank`), the closest lineage
    first; with `spec` (the plan may adopt), also other lineages' states of `spec`'s run,
    after those (the highest epoch, then the tag, decides between two of them). Of two of one
    lineage at one step (a plan restarted the stage below steps it saved), the later epoch's,
    as the writer orders them. With `run`, an untagged state (the root's, usable by every plan)
    counts only if it is of that run: another run's or version's files in the directory were
    announced, agreed on, and then refused by the loader, which ended every worker. A file
    that is not `intact` is never announced."""
    best: dict[str, dict[int, tuple[tuple[int, int, str], SavedState]]] = {}
    for state in list_states(directory):
        position = rank(state.tag)
        if state.tag is None and run is not None and other_run(state.path, run) is not None:
            continue
        epoch = written(state)[0]
        if position is None:
            if spec is None or state.tag is None or other_run(state.path, spec) is not None:
                continue
            order = (FOREIGN, -epoch, state.tag)
        else:
            order = (position, -epoch, "")
        if not intact(state.path):
            continue
        current = best.setdefault(state.key, {}).get(state.step)
        if current is None or order < current[0]:
            best[state.key][state.step] = (order, state)
    return {
        key: {step: steps[step][1] for step in sorted(steps)[-max_steps:]}
        for key, steps in best.items()
        if steps
    }


_intact: dict[tuple[str, int, int, int], bool] = {}


def intact(path: Path) -> bool:
    """Does our state file at `path` look whole, from its header alone (remembered while the
    file is unchanged)? A state of format /3 whose size is what its header's tensors need, or
    one of the older pickled formats (only loading reads those). A power cut could leave a
    just-renamed state empty, zeroed or short: announced, it was agreed on, failed to load
    and was fetched from nobody, and the stage restarted from initial weights."""
    try:
        stat = path.stat()
    except OSError:
        return False
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _intact:
        if len(_intact) > 1024:
            _intact.clear()
        _intact[key] = _whole(path)
    return _intact[key]


def _whole(path: Path) -> bool:
    try:
        if not state_file.is_pickled(path):  # only loading reads those
            state_file.check_whole(path)
        return True
    except (OSError, WireError):
        return False


def has_own_state(announced: Mapping[str, Announced], rank: StateRank) -> bool:
    """Does any member hold a state saved under the plan's own lineage (rank 0)?"""
    return any(
        rank(tag) == 0
        for states in announced.values()
        for steps in states.values()
        for _, tag in steps.values()
    )


def candidates(
    announced: Mapping[str, Announced], rank: StateRank
) -> list[tuple[str, dict[str, Held]]]:
    """What a plan may start from: ("", the states it may use), then (lineage id, that
    lineage's states) for the other lineages announced, sorted by id: each member's
    LINEAGES_PER_MEMBER with its newest steps (each candidate is judged against every announced
    state: one member's 16,384 made-up lineages cost every member minutes of CPU). Each: peer ->
    Held."""
    own: dict[str, Held] = {peer: {} for peer in announced}
    other: dict[str, dict[str, Held]] = {}
    newest: dict[str, dict[str, int]] = {}  # peer -> lineage -> its newest step in it
    for peer, states in announced.items():
        for key, steps in states.items():
            for step, (digest, tag) in steps.items():
                if rank(tag) is not None:
                    own[peer].setdefault(key, {})[step] = digest
                elif (lineage := id_of_tag(tag)) is not None:
                    held = other.setdefault(lineage, {p: {} for p in announced})
                    held[peer].setdefault(key, {})[step] = digest
                    mine = newest.setdefault(peer, {})
                    mine[lineage] = max(step, mine.get(lineage, step))
    kept = {
        lineage
        for steps in newest.values()
        for lineage in sorted(steps, key=lambda n: (-steps[n], n))[:LINEAGES_PER_MEMBER]
    }
    return [("", own), *sorted((n, held) for n, held in other.items() if n in kept)]


def every_lineage(announced: Mapping[str, Announced]) -> dict[str, Held]:
    """What each member says it holds, whatever the lineage: peer -> Held. A tag is only the
    announcer's word, so whose blocks a lone voice contests is judged on this (covers.py)."""
    found: dict[str, Held] = {}
    for peer, states in announced.items():
        held = found.setdefault(peer, {})
        for key, steps in states.items():
            for step, (digest, _) in steps.items():
                held.setdefault(key, {})[step] = digest
    return found


def link_adopted(
    directory: Path,
    adopted: str,
    step_of: Callable[[str], int],
    digests: Mapping[str, str],
    tag: str | None,
) -> list[Path]:
    """Link each agreed state (layers key -> sha256) of lineage `adopted` that this machine
    holds, at its agreed step (`step_of`: StartPoint.state_step, the stages may share no step),
    under the plan's tag `tag`: the plan's lineage then has it. The links made."""
    made = []
    for state in list_states(directory):
        digest = digests.get(state.key)
        layers = key_range(state.key)
        if digest is None or layers is None or state.step != step_of(state.key):
            continue
        if id_of_tag(state.tag) != adopted:
            continue
        target = stamped_path(directory, layers, state.step, tag)
        try:
            if target.exists() or file_sha256(state.path) != digest:
                continue
            _link(state.path, target)
        except OSError:  # pruned meanwhile: the state is fetched instead
            continue
        made.append(target)
    return made


def _link(source: Path, target: Path) -> None:
    """A hard link (a copy where there are none), made atomically: replicas of a stage on
    one machine may link the same state at once. Under a fresh temporary name (a copy into
    mkstemp's own file): a symlink planted at the fixed name it had was written through. A
    copy's bytes, then the new name, are on disk before it is announced (durable.py)."""
    link_into_place(source, target, f".{target.name}.{os.getpid()}.", ".adopt")
