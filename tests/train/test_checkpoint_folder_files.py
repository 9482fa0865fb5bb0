"""A checkpoint folder's files are read only as regular files (p2ptrain/durable.py
`open_regular`): a FIFO under a state's name hung `p2ptrain checkpoints list` and the worker's
start forever, and a symlink there was followed. And a latest link or an adopted state is made
under a fresh temporary name: a symlink planted at the fixed name it had was written through
where a copy replaced the hard link."""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.app import main
from p2ptrain.durable import NotRegularFile, open_regular
from p2ptrain.errors import WireError
from p2ptrain.records.run import RunSpec
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import checkpoint_path, stamped_path, sweep_unfinished
from p2ptrain.train.checkpoint_read import other_run, read_file
from p2ptrain.train.export import merged_weights
from p2ptrain.train.model import build_layers
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume.adopt import intact, link_adopted
from p2ptrain.worker.resume.copy_sources import FILE_NAME, read_sources
from p2ptrain.worker.resume.saved_report import saved_stages

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=20)
HANG_GUARD_S = 60.0  # never reached by a call that returns; only a hang's bound


def save(directory: Path, step: int, tag: str | None = None) -> Path:
    model = build_layers(SPEC, range(0, 2))
    snapshot = StageSnapshot.take(model, make_optimizer(model, SPEC), step)
    record_step(directory, SPEC, model, snapshot, tag)
    return stamped_path(directory, range(0, 2), step, tag)


def returns(call: Callable[[], Any], fifo: Path) -> Any:
    """`call()`'s result, run in a thread; fails (and frees the thread) if it hangs on `fifo`."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    if thread.is_alive():  # a writer's open frees a reader blocked in its open
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{call} hung on the FIFO {fifo}")
    if errors:
        raise errors[0]
    return result[0] if result else None


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = stamped_path(tmp_path, range(0, 2), 5)
    os.mkfifo(path)
    return path


def test_a_fifo_under_a_states_name_is_refused_by_every_reader(fifo: Path) -> None:
    for read in (state_file.is_pickled, state_file.check, state_file.check_whole, state_file.read):
        with pytest.raises(WireError, match="not a regular file"):
            returns(functools.partial(read, fifo), fifo)
    with pytest.raises(NotRegularFile):
        returns(lambda: file_sha256(fifo), fifo)
    assert "not a regular file" in returns(lambda: str(other_run(fifo, SPEC)), fifo)
    assert returns(lambda: intact(fifo), fifo) is False
    assert returns(lambda: saved_stages(fifo.parent, SPEC), fifo) == ()


def test_a_fifo_beside_the_states_is_skipped_by_the_cli_and_the_export(
    fifo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = fifo.parent
    save(directory, 3)
    argv = ["checkpoints", "list", "--checkpoint-dir", str(directory)]
    assert returns(lambda: main(argv), fifo) == 0
    assert "not a regular file" in capsys.readouterr().out
    merged = returns(lambda: merged_weights(SPEC, directory), fifo)
    assert merged.step == 3 and any("not a regular file" in line for line in merged.skipped)


def test_a_fifo_as_the_copies_file_reads_as_no_copies(tmp_path: Path) -> None:
    fifo = tmp_path / FILE_NAME
    os.mkfifo(fifo)
    assert returns(lambda: read_sources(tmp_path), fifo) == {}


def test_a_symlink_under_a_states_name_is_not_followed(tmp_path: Path) -> None:
    state = save(tmp_path / "elsewhere", 3)
    link = stamped_path(tmp_path, range(0, 2), 3)
    link.symlink_to(state)
    with pytest.raises(WireError, match="symbolic link"):
        state_file.check(link)
    with pytest.raises(NotRegularFile, match="symbolic link"):
        file_sha256(link)
    assert "symbolic link" in str(other_run(link, SPEC))
    assert read_file(state)["step"] == 3  # the file itself reads as before
    with open_regular(state) as f:
        assert f.read(8) == state.read_bytes()[:8]


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("private\n")
    victim.chmod(0o600)
    return victim


def _no_hard_links(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(1, "Operation not permitted")  # a file system without hard links

    monkeypatch.setattr(os, "link", refuse)


def test_a_latest_copy_never_writes_through_a_planted_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "ck"
    directory.mkdir()
    victim = _victim(tmp_path)
    latest = checkpoint_path(directory, range(0, 2))
    (directory / f".{latest.name}.{os.getpid()}.link").symlink_to(victim)  # the old fixed name
    _no_hard_links(monkeypatch)
    state = save(directory, 3)
    assert victim.read_text() == "private\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert latest.read_bytes() == state.read_bytes()
    assert not latest.is_symlink() and latest.stat().st_ino != state.stat().st_ino  # a copy
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_an_adopted_copy_never_writes_through_a_planted_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = _victim(tmp_path)
    state = save(tmp_path, 3, "a" * 16 + "-e1")
    mine = "b" * 16 + "-e1"
    target = stamped_path(tmp_path, range(0, 2), 3, mine)
    (tmp_path / f".{target.name}.{os.getpid()}.adopt").symlink_to(victim)
    _no_hard_links(monkeypatch)
    made = link_adopted(tmp_path, "a" * 16, lambda key: 3, {"L0-2": file_sha256(state)}, mine)
    assert made == [target] and target.read_bytes() == state.read_bytes()
    assert victim.read_text() == "private\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert (target.stat().st_mode & 0o777) == 0o600  # mkstemp's file: ours alone


def test_a_hard_link_is_still_made_where_there_are_hard_links(tmp_path: Path) -> None:
    state = save(tmp_path, 3)
    assert checkpoint_path(tmp_path, range(0, 2)).stat().st_ino == state.stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_the_fresh_temporary_names_of_a_dead_writer_are_swept(tmp_path: Path) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()  # reaped: its pid no longer runs
    old = time.time() - 120
    names = [
        f".stage-L0-2.pt.{finished.pid}.a1b2c3d4.link",
        f".stage-L0-2.step5.0123456789abcdef-e1.pt.{finished.pid}.x_9kq2ab.adopt",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"x" * 10)
        os.utime(tmp_path / name, (old, old))
    assert sweep_unfinished(tmp_path) == 20
    assert list(tmp_path.iterdir()) == []
