"""A crash leaves nothing (issue 26): the planner's search process dies with the control process,
however that ends. It was a multiprocessing pool: its spawn worker and resource tracker outlived
a SIGKILLed node (reparented to init), and the test suite left them too."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from p2ptrain.control.links import Link
from p2ptrain.control.planning import search_process
from p2ptrain.control.planning.planner import build_matrices, compute_plan
from p2ptrain.records import RunSpec
from tests.conftest import REPO_ROOT, descendants_of
from tests.integration.test_control_orphans import wait_all_gone

PEERS = [f"p{i}" for i in range(6)]
LINKS = {
    (a, b): Link(2.0 + i + j, 100.0 / (1 + i), 0.0)
    for i, a in enumerate(PEERS)
    for j, b in enumerate(PEERS)
    if a < b
}

# a parent that plans once, says which processes it started, then waits to be killed
PARENT = """
import sys, time, trio
from p2ptrain.control.planning import search_process
from tests.control.planning.test_search_process import PEERS, LINKS
from p2ptrain.control.planning.planner import build_matrices
from p2ptrain.records import RunSpec
trio.run(search_process.compute_plan, build_matrices(PEERS, LINKS), RunSpec().replace(stages=2, n_layer=4))
print(search_process.pid(), flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(600)
"""


def _plan() -> object:
    return trio.run(
        search_process.compute_plan,
        build_matrices(PEERS, LINKS),
        RunSpec().replace(stages=2, n_layer=4),
    )


def test_a_killed_search_process_is_replaced_and_a_stopped_one_exits() -> None:
    expected = compute_plan(build_matrices(PEERS, LINKS), RunSpec().replace(stages=2, n_layer=4))
    assert _plan() == expected
    first = search_process.pid()
    assert first is not None and first != os.getpid()
    os.kill(first, signal.SIGKILL)
    assert search_process._process is not None
    search_process._process.proc.wait(timeout=10)  # dead (a request it took would fail)
    assert _plan() == expected  # a fresh one
    second = search_process.pid()
    assert second not in (None, first)
    # it searches behind its node's own loop (which keeps claiming the planner role)
    assert os.getpriority(os.PRIO_PROCESS, second) == min(
        19, os.getpriority(os.PRIO_PROCESS, 0) + search_process.SEARCH_NICENESS
    )
    search_process.stop()  # closes its pipe: it exits
    assert search_process.pid() is None and wait_all_gone([second], 5) == []


def test_a_warmed_search_process_answers_the_first_search() -> None:
    search_process.stop()
    search_process.warm()  # what the planner does while its first plan waits
    warmed = search_process.pid()
    assert warmed is not None
    search_process.warm()  # a warm one is kept, not replaced
    assert search_process.pid() == warmed
    expected = compute_plan(build_matrices(PEERS, LINKS), RunSpec().replace(stages=2, n_layer=4))
    assert _plan() == expected and search_process.pid() == warmed
    search_process.stop()
    assert wait_all_gone([warmed], 5) == []


def _parent(how: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, how],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert parent.stdout is not None
    line = parent.stdout.readline().decode().strip()
    assert line.isdigit(), f"the parent did not plan: {line!r}"
    tree = descendants_of(parent.pid)
    assert int(line) in tree
    return parent, tree


def test_nothing_outlives_a_sigkilled_parent(tmp_path: Path) -> None:
    parent, tree = _parent("sleep")
    os.kill(parent.pid, signal.SIGKILL)  # not the group: the children are on their own
    parent.wait()
    assert wait_all_gone(tree, 5) == [], "the search process (or a helper) outlived its parent"


def test_nothing_outlives_a_parent_that_exits() -> None:
    parent, tree = _parent("exit")
    assert parent.wait(timeout=30) == 0
    assert wait_all_gone(tree, 5) == []


def test_an_idle_search_process_exits_and_the_next_search_starts_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle planner gives its search process's memory back; a request that crosses the
    child's idle exit is answered by a fresh one."""
    monkeypatch.setattr(search_process, "IDLE_EXIT_S", 0.5)
    search_process.stop()
    expected = compute_plan(build_matrices(PEERS, LINKS), RunSpec().replace(stages=2, n_layer=4))
    assert _plan() == expected
    # its pid whether or not it already left (it may, 0.5 s idle, on a loaded machine)
    assert search_process._process is not None
    first = search_process._process.proc.pid
    assert wait_all_gone([first], 10) == []
    assert search_process._process.proc.wait() == search_process.IDLE_EXIT_CODE
    assert search_process.pid() is None
    assert _plan() == expected  # a fresh child
    assert search_process.pid() not in (None, first)
    search_process.stop()


def test_an_exited_search_process_is_reaped_without_anyone_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A candidate that planned for a moment never looks at its search process again: the child
    that exited idle must not stay a zombie for the node's life."""
    monkeypatch.setattr(search_process, "IDLE_EXIT_S", 0.5)
    search_process.stop()
    _plan()
    assert search_process._process is not None
    child = search_process._process.proc.pid
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # a zombie keeps its /proc entry until its parent waits for it
    assert not Path(f"/proc/{child}").exists()
    search_process.stop()


def test_a_child_that_cannot_load_the_scheduler_says_why_at_each_request(tmp_path: Path) -> None:
    """numpy and the scheduler load before the child nices itself; one that fails to load is
    each request's answer (SearchFailed with its traceback), not a child that dies at start
    and is started again by every search."""
    broken = tmp_path / "numpy"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('numpy is broken here')\n")
    child = subprocess.Popen(
        [sys.executable, "-m", "p2ptrain.control.planning.search_process", "30"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO_ROOT}"},
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        for _ in range(2):
            search_process._write_frame(child.stdin, pickle.dumps(("assess", ())))
            reply = search_process._read_frame(child.stdout)
            assert reply is not None, "the child died instead of answering"
            ok, value = pickle.loads(reply)
            assert not ok and isinstance(value, search_process.SearchFailed)
            assert "numpy is broken here" in str(value)
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0
