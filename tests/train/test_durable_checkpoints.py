"""A saved state is durable before its name is (p2ptrain/durable.py `durable_replace`): a power
cut right after the rename left an empty or zeroed file under a stamped name. And a writer's
pruning counts only its own run's untagged states (`of_run`): a shared directory's other run
lost its states, its newest included."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states, stamped_path
from p2ptrain.train.model import build_layers
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume.adopt import link_adopted
from p2ptrain.worker.resume.state_fetch import receive_file
from p2ptrain.worker.resume.state_transfer import SIZE

SPEC = RunSpec().replace(n_layer=4, n_head=2, n_embd=16, block_size=8, steps=20)
OTHER = SPEC.replace(run_id="another-run")


def save(directory: Path, spec: RunSpec, layers: range, step: int, tag: str | None = None) -> None:
    model = build_layers(spec, layers)
    snapshot = StageSnapshot.take(model, make_optimizer(model, spec), step)
    record_step(directory, spec, model, snapshot, tag)


def _journal(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What is synced and renamed, in order: ("fsync", path), ("replace", target)."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def synced(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def replaced(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("replace", str(Path(dst).resolve())))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", synced)
    monkeypatch.setattr(os, "replace", replaced)
    return events


def _synced_around(events: list[tuple[str, str]], target: Path, tmp_prefix: str) -> None:
    """The file renamed to `target` (from a name starting `tmp_prefix`) was synced just
    before, its directory just after."""
    index = events.index(("replace", str(target.resolve())))
    assert events[index - 1][0] == "fsync"
    assert events[index - 1][1].startswith(str(target.parent.resolve() / tmp_prefix))
    assert events[index + 1] == ("fsync", str(target.parent.resolve()))


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")


@needs_proc
def test_a_state_s_bytes_are_synced_before_its_rename_and_the_rename_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _journal(monkeypatch)
    tag = "a" * 16 + "-e1"
    save(tmp_path, SPEC, range(0, 2), 3, tag)
    state = stamped_path(tmp_path, range(0, 2), 3, tag)
    _synced_around(events, state, state.name + ".")

    events.clear()  # an adopted state linked under the plan's tag
    mine = "b" * 16 + "-e1"
    made = link_adopted(tmp_path, "a" * 16, lambda key: 3, {"L0-2": file_sha256(state)}, mine)
    assert made == [stamped_path(tmp_path, range(0, 2), 3, mine)]
    _synced_around(events, made[0], f".{made[0].name}.")


@needs_proc
def test_a_fetched_state_is_synced_before_its_rename_and_the_rename_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(tmp_path / "holder", SPEC, range(0, 2), 3)
    source = stamped_path(tmp_path / "holder", range(0, 2), 3)
    data = source.read_bytes()
    target = stamped_path(tmp_path / "taker", range(0, 2), 3)
    events = _journal(monkeypatch)

    async def fetch() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(SIZE.pack(len(data)) + data)
        reader.feed_eof()
        await receive_file(reader, target, file_sha256(source), len(data), "L0-2")

    asyncio.run(fetch())
    assert target.read_bytes() == data
    _synced_around(events, target, target.name + ".")


def test_a_writer_never_prunes_another_run_s_untagged_states(tmp_path: Path) -> None:
    """Another run's root states in the same directory: of the same range (its newest state
    included) and of a range inside ours (an "earlier cut")."""
    for step in range(1, 4):
        save(tmp_path, OTHER, range(0, 2), step)
        save(tmp_path, OTHER, range(0, 1), step)
    theirs = {s.path for s in list_states(tmp_path)}
    for step in range(4, 10):
        save(tmp_path, SPEC, range(0, 2), step)
    left = list_states(tmp_path)
    assert theirs <= {s.path for s in left}
    ours = sorted(s.step for s in left if s.path not in theirs)
    assert ours == [6, 7, 8, 9]  # our own history is still pruned to its newest steps
