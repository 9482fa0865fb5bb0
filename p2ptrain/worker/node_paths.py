"""Where a worker keeps and reads a run's files on this machine. The run spec is the organiser's
word, read on every volunteer's machine: the node's own flags beat its paths, and a path the
node did not name is taken only inside the node's working directory.

- Checkpoints (`place_checkpoints`): its own `--checkpoint-dir`, else the run spec's
  `checkpoint_dir` if that stays inside the working directory, else the default
  (`runs/<run_id>/checkpoints`, train/checkpoint_folder.py). An absolute or climbing folder (`/dev/shm`,
  `/`, `/tmp/shared`, `../..`) made every volunteer write multi-GB states where the organiser
  chose, RAM-backed or shared with other users (docs/security.md, row 37.29).
- Data (`place_data`): `--corpus PATH` and `--tokenizer PATH` name this node's copy of the run's
  data and tokenizer.json (wherever the volunteer keeps it; a pinned run still checks its
  bytes, data_sha256). Unpinned, a spec's own local path is read only inside the working
  directory, never a hidden one (`.ssh`, `data/.env`), and not at all where the working
  directory is the home directory or above it (a home is full of private folders): the
  organiser's spec made every volunteer train on, and send activations of, any folder it
  named, `~/.ssh` included (row 36.22). Such a spec is refused in one line that says how to
  name a copy; a pinned run reads any path, since only the run's bytes pass its digest.
"""

from __future__ import annotations

import logging
import os
from pathlib import PurePath

from p2ptrain.errors import UserError
from p2ptrain.records import RunSpec
from p2ptrain.worker.settings import WorkerSettings

log = logging.getLogger("p2ptrain.worker")
# the data sources that are no path of this machine (train/data.py: EMBEDDED, STDLIB; no torch
# here)
BUILT_IN = ("embedded", "stdlib")
_warned: set[tuple[str, str]] = set()  # (run id, folder): said once, not at every plan


def node_spec(spec: RunSpec, settings: WorkerSettings, from_organiser: bool) -> RunSpec:
    """`spec` with this node's folders and data files (the module's docstring); UserError if
    the run's data is not this node's to read."""
    spec = place_checkpoints(spec, settings.checkpoint_dir, from_organiser)
    return place_data(spec, settings.corpus, settings.tokenizer, from_organiser)


def place_data(
    spec: RunSpec, own_corpus: str | None, own_tokenizer: str | None, from_organiser: bool = True
) -> RunSpec:
    """`spec` reading this node's own copies where it names them; UserError if, unpinned, the
    organiser's spec names a local data or tokenizer path this node does not read unpinned
    (`unpinned_readable`). A
    built-in corpus (embedded, stdlib) is no path: a node's --corpus does not replace it (a
    leftover flag would train this peer on other bytes than the run's)."""
    if own_corpus and spec.data.source in BUILT_IN:
        log.warning("the run trains on the %s corpus: --corpus is not used", spec.data.source)
        own_corpus = None
    changes = {"data": own_corpus, "tokenizer": own_tokenizer}
    spec = spec.replace(**{name: path for name, path in changes.items() if path})
    if from_organiser and not spec.data.data_sha256:
        source = "" if own_corpus or spec.data.source in BUILT_IN else spec.data.source
        for what, path, flag in (
            ("data", source, "--corpus"),
            ("tokenizer", "" if own_tokenizer else spec.data.tokenizer, "--tokenizer"),
        ):
            why = _unreadable_why(path) if path else None
            if why:
                raise UserError(
                    f"the run names {what} {path!r}, {why}, and does not pin its data "
                    f"(data_sha256): not read; join {flag} PATH names this node's copy (or the "
                    "organiser pins the run: p2ptrain digest)"
                )
    return spec


def unpinned_readable(path: str, cwd: str | None = None, home: str | None = None) -> bool:
    """May an organiser's unpinned spec make this node read `path`? Only a plain path inside
    the working directory `cwd`, and only where `cwd` is not the home directory `home` or one
    of its ancestors."""
    return _unreadable_why(path, cwd, home) is None


def _unreadable_why(path: str, cwd: str | None = None, home: str | None = None) -> str | None:
    if not stays_inside(path):
        return "outside this node's working directory"
    if any(part.startswith(".") for part in PurePath(path).parts):
        return "a hidden path"  # .ssh, .aws, .env: where private keys live
    here = os.path.realpath(cwd or os.getcwd())
    home_dir = os.path.realpath(home or os.path.expanduser("~"))
    if home_dir == here or home_dir.startswith(here.rstrip(os.sep) + os.sep):
        return "in a working directory that is or holds the home directory"
    return None


def own_copies(spec: RunSpec) -> tuple[str | None, str | None]:
    """The data and tokenizer paths a run spec of one's own names, absolute: what a harness
    passes its nodes as their own copies (--corpus, --tokenizer), since a node reads a spec's
    unpinned path only inside its working directory."""
    source = "" if spec.data.source in BUILT_IN else spec.data.source
    return _absolute(source), _absolute(spec.data.tokenizer)


def _absolute(path: str) -> str | None:
    return os.path.abspath(os.path.expanduser(path)) if path else None


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
