"""`p2ptrain checkpoints list|prune`: what a machine holds of a run's stage states, by lineage,
and the operator's way to remove old ones.

A node prunes only its own plan lineage's old steps (train/checkpoint.py): states saved by an
earlier swarm, or by the other half of a partition, stay until an operator removes them here.
`prune` keeps the `--keep` newest steps of every lineage (never fewer than one: the newest state
of each lineage always stays); `--dry-run` lists what it would delete and deletes nothing. Only
states of the run given (run id, model shape, data digest, read from each file) are listed or
pruned: another run's files in a shared directory are left as they are, said in one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.errors import UserError

if TYPE_CHECKING:  # torch: imported when the command runs
    from p2ptrain.records.run import RunSpec
    from p2ptrain.train.checkpoint_folder import SavedState


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=("list", "prune"), help="list the states, or prune old ones"
    )
    parser.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="the stage checkpoints (default: the run spec's checkpoint_dir)",
    )
    parser.add_argument(
        "--keep",
        type=int,
        default=None,
        help="prune: the newest steps kept per lineage and stage (default: what nodes keep)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="prune: say what would go, delete nothing"
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.records.run import load_run_spec
    from p2ptrain.train.checkpoint import KEEP_STEPS, prunable  # torch: the train extra
    from p2ptrain.train.checkpoint_folder import list_states
    from p2ptrain.train.checkpoint_read import other_run

    if args.action == "list" and (args.keep is not None or args.dry_run):
        raise UserError("--keep and --dry-run are prune's: `checkpoints prune ... --dry-run`")
    spec = load_run_spec(args.run)
    directory = states_directory(args.checkpoint_dir, spec)
    states, broken, foreign = [], [], []
    for state in list_states(directory):
        problem = unreadable(state.path)
        if problem is not None:
            broken.append((state, problem))
        elif (other := other_run(state.path, spec)) is None:
            states.append(state)
        else:  # a shared directory: another run's lineages are not ours to count or prune
            foreign.append((state, other))
    for state, problem in broken:  # neither listed nor counted among the kept: never prune for them
        print(f"not a stage state (left as it is): {state.path}: {problem}")
    if foreign:
        first, why = foreign[0]
        print(f"left {len(foreign)} files of another run as they are ({first.path.name}: {why})")
    by_lineage: dict[str, list[SavedState]] = {}
    for state in states:
        by_lineage.setdefault(lineage_name(state.tag), []).append(state)
    if args.action == "list":
        if not states:
            print(f"{directory}: no stage states")
        for lineage, saved in sorted(by_lineage.items(), key=lambda item: -newest(item[1])):
            stages = sorted({s.key for s in saved})
            size = sum(_size(s.path) for s in saved)
            print(
                f"lineage {lineage}: newest step {newest(saved)}, stages {', '.join(stages)}, "
                f"steps {', '.join(map(str, sorted({s.step for s in saved})))}, "
                f"{len(saved)} files, {size / 1e6:.1f} MB"
            )
        return 0
    keep = KEEP_STEPS if args.keep is None else args.keep
    if keep < 1:
        raise UserError("--keep must be >= 1: the newest state of each lineage always stays")
    doomed = [
        old
        for saved in by_lineage.values()
        for key in {s.key for s in saved}
        for old in prunable([s for s in saved if s.key == key], keep)
    ]
    for old in sorted(doomed, key=lambda s: s.path.name):
        print(f"{'would remove' if args.dry_run else 'removing'} {old.path}")
        if not args.dry_run:
            try:
                old.path.unlink(missing_ok=True)
            except OSError as exc:  # a read-only directory: one line, not a traceback
                raise UserError(f"cannot remove {old.path}: {exc.strerror or exc}") from None
    freed = sum(_size(s.path) for s in doomed) if args.dry_run else 0
    tail = f" ({freed / 1e6:.1f} MB)" if args.dry_run else ""
    print(
        f"{len(doomed)} files {'would go' if args.dry_run else 'removed'}{tail}; kept the "
        f"newest {keep} steps of each of {len(by_lineage)} lineages"
    )
    return 0


def states_directory(given: str | None, spec: RunSpec) -> Path:
    """Where the run's stage states are (`--checkpoint-dir`, else the run spec's), or UserError
    if that is no directory (a silent "no stage states" told a typo from an empty one)."""
    from p2ptrain.train.checkpoint_folder import checkpoint_dir  # torch: the train extra

    directory = Path(given) if given else checkpoint_dir(spec)
    if not directory.is_dir():
        what = "not a directory" if directory.exists() else "no such directory"
        raise UserError(f"{directory}: {what} (give the stage checkpoints with --checkpoint-dir)")
    return directory


def unreadable(path: Path) -> str | None:
    """Why the file cannot be a stage state, from its header (its tensors are not read), or None.
    A state of the older pickled formats is taken as it is (only loading reads it)."""
    from p2ptrain.errors import WireError
    from p2ptrain.train import state_file

    try:
        if state_file.is_pickled(path):
            return None
        state_file.check(path)
    except (WireError, OSError) as exc:
        return str(exc)
    return None


def lineage_name(tag: str | None) -> str:
    """A state's lineage as `list` names it: its id, or "root" for untagged states."""
    return "root" if tag is None else tag.rpartition("-e")[0]


def newest(saved: list[SavedState]) -> int:
    return max(s.step for s in saved)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
