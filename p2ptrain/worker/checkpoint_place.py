"""Where a worker saves a run's stage states: its own `--checkpoint-dir`, else the run spec's
`checkpoint_dir` if that stays inside the node's working directory, else the default
(`runs/<run_id>/checkpoints`, train/checkpoint.py).

The run spec is the organiser's word, read on every volunteer's machine: an absolute or
climbing folder (`/dev/shm`, `/`, `/tmp/shared`, `../..`) made every volunteer write multi-GB
states where the organiser chose, RAM-backed or shared with other users (docs/security.md,
row 37.29). A volunteer who wants such a folder names it itself."""

from __future__ import annotations

import logging
from pathlib import PurePath

from p2ptrain.records import RunSpec

log = logging.getLogger("p2ptrain.worker")
_warned: set[tuple[str, str]] = set()  # (run id, folder): said once, not at every plan


def place_checkpoints(spec: RunSpec, own_dir: str | None, from_organiser: bool = True) -> RunSpec:
    """`spec` with the folder this node saves in (see the module's docstring); a spec that is
    not the organiser's word (`from_organiser` false: a static plan's local file) is taken as
    it is."""
    if own_dir:  # a node-local setting beats the run's
        return spec.replace(checkpoint_dir=own_dir)
    named = spec.checkpoint.checkpoint_dir
    if not named or stays_inside(named) or not from_organiser:
        return spec
    if (spec.run_id, named) not in _warned:
        _warned.add((spec.run_id, named))
        log.warning(
            "the run spec names checkpoint_dir %r, outside this node's working directory: saving "
            "under runs/%s/checkpoints instead (join --checkpoint-dir chooses a folder)",
            named,
            spec.run_id,
        )
    return spec.replace(checkpoint_dir="")


def stays_inside(path: str) -> bool:
    """Is `path` relative, without `..` or a leading `~` (never expanded, but meant as home)?"""
    parts = PurePath(path).parts
    return not PurePath(path).is_absolute() and ".." not in parts and not path.startswith("~")
