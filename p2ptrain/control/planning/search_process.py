"""The scheduler's search runs in a process of its own, not a thread of the control process.

The search is Python and numpy under the GIL for up to tens of thousands of cost evaluations: in
a thread it starved the control process's trio loop on a loaded machine, its gossip stopped for
longer than DEAD_AFTER_S and the swarm deposed the planner for planning. One child process,
`python -m p2ptrain.control.planning.search_process`, started by procs.spawn on the first search
and again after it exited: it exits after IDLE_EXIT_S without a request (a swarm re-plans on
changes, and an idle child's ~90 MiB are the planner's to give back); procs.spawn, not
multiprocessing (whose spawn worker and resource tracker outlived a SIGKILLed node, reparented
to init). It dies with the control process however that ends: the kernel kills it when the thread
that started it (trio's, the main thread) exits (PR_SET_PDEATHSIG), it stays in the control
process's process group, and it exits when its request pipe closes.

It does all of the planner's numeric work, not just searches (numbers.py: the live matrices,
a plan's price), so that the control process never loads numpy or the scheduler.
Requests and replies are length-prefixed pickles over the child's stdin and stdout: the two ends
are the same program, and nothing from the network reaches the pipe but the records and
matrices we built. A reply holds plain Python only (an error the caller does not handle by type
comes back as SearchFailed, its text and the child's traceback).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import trio

from p2ptrain import procs
from p2ptrain.control.planning.numbers import Assessment, PlanInputs, Searched, SearchFailed
from p2ptrain.control.planning.placement import NoPlacementFits, Placement
from p2ptrain.flags import python_module
from p2ptrain.records import Plan, RunSpec

if TYPE_CHECKING:
    from p2ptrain.control.planning.planner import Matrices

_LENGTH = struct.Struct("!Q")
SEARCH_NICENESS = 10  # added to the control process's
IDLE_EXIT_S = 30.0
IDLE_EXIT_CODE = 3  # the child exited for want of requests: a request it missed is sent again


class SearchProcessDied(RuntimeError):
    """The search process ended mid-request (killed, out of memory): the next request starts a
    fresh one."""


class _SearchProcess:
    def __init__(self) -> None:
        self.proc = procs.spawn(
            python_module("p2ptrain.control.planning.search_process", str(IDLE_EXIT_S)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            die_with_parent=signal.SIGKILL,
            new_session=False,  # a signal to the control process's group reaches it too
        )
        self.lock = threading.Lock()  # one request at a time on the pipe
        # reaped as soon as it exits (idle, killed): a candidate that planned for a moment never
        # looks at it again, and its exited child stayed a zombie for the node's life
        threading.Thread(target=self.proc.wait, name="search-reaper", daemon=True).start()

    def call(self, kind: str, args: tuple[Any, ...]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self.lock:
            try:
                _write_frame(self.proc.stdin, pickle.dumps((kind, args)))
                reply = _read_frame(self.proc.stdout)
            except OSError:
                reply = None
            if reply is None:
                raise SearchProcessDied(f"the search process exited ({self.proc.poll()})")
            ok, value = pickle.loads(reply)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the child's cue to exit
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_process: _SearchProcess | None = None


def _started() -> _SearchProcess:
    """The search process, started on first use, or again after it died. Called from the
    thread that runs trio: its parent-death signal fires when that thread exits, so it must not
    be one of trio's worker threads (they exit when idle)."""
    global _process
    if _process is None or _process.proc.poll() is not None:
        _process = _SearchProcess()
    return _process


def warm() -> None:
    """Start the search process ahead of the first search (the planner waits for its first
    plan's measurements meanwhile): on a busy machine the child's start took 10-20 s while it
    loaded niced (main() now loads first), and still takes seconds.
    Called from the thread that runs trio, as _started() requires."""
    _started()


def pid() -> int | None:
    """The search process's pid, if one is running."""
    return None if _process is None or _process.proc.poll() is not None else _process.proc.pid


def stop() -> None:
    """End the search process (if any); the next request starts another."""
    global _process
    process = _process
    if process is not None:
        process.close()  # from a worker thread (release): trio's thread may start another now
        if _process is process:
            _process = None


async def release() -> None:
    """End the search process now, rather than after IDLE_EXIT_S, when nothing is due for it
    soon (its exit is waited on from a worker thread)."""
    if pid() is not None:
        await trio.to_thread.run_sync(stop)


async def _call(kind: str, *args: Any) -> Any:
    """The child's answer to `kind` (a name in _work()) on `args`, waited on from a worker
    thread."""
    process = _started()
    try:
        return await trio.to_thread.run_sync(process.call, kind, args)
    except SearchProcessDied:
        if process.proc.wait() != IDLE_EXIT_CODE:
            raise
    # our request crossed the idle child's exit: a fresh child answers it
    return await trio.to_thread.run_sync(_started().call, kind, args)


async def compute_plan(matrices: Matrices, run: RunSpec) -> Placement:
    """planner.compute_plan, in the search process."""
    placement: Placement = await _call("compute_plan", matrices, run)
    return placement


async def assess(inputs: PlanInputs, plan: Plan | None) -> Assessment:
    """numbers_work.assess, in the search process."""
    assessment: Assessment = await _call("assess", inputs, plan)
    return assessment


async def search(inputs: PlanInputs, matrices: bytes | None, plan: Plan | None) -> Searched:
    """numbers_work.search, in the search process."""
    searched: Searched = await _call("search", inputs, matrices, plan)
    return searched


def _write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def _read_frame(stream: IO[bytes]) -> bytes | None:
    """One frame, or None at the end of the stream."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(header)
    payload = stream.read(length)
    return payload if len(payload) == length else None


def main() -> None:
    """The child: answer requests until the control process closes the pipe (or dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the node to act on
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the reply stream
    # numpy and the scheduler load before the niceness: niced, on a busy 2-core box, loading
    # them took 8-9 s of a failover's 20 (a new planner's first search waits for it), where
    # at our own priority it takes about one; one that fails to load is each request's answer
    work: dict[str, Callable[..., object]] = {}
    unloaded: SearchFailed | None = None
    try:
        work = _work()
    except Exception as exc:
        unloaded = _failed(exc)
    # behind our own node: on a busy machine a search at full priority took the CPU its control
    # loop needed to keep claiming the planner role, and the swarm deposed a live planner (bench
    # scaleout, 2026-11-26); the evaluation budget, not the clock, decides the plan
    os.nice(SEARCH_NICENESS)
    idle_exit_s = float(sys.argv[1]) if len(sys.argv) > 1 else IDLE_EXIT_S
    while True:
        if not select.select([requests], [], [], idle_exit_s)[0]:
            sys.exit(IDLE_EXIT_CODE)
        if (request := _read_frame(requests)) is None:
            break
        kind, args = pickle.loads(request)
        try:
            reply: tuple[bool, object] = (
                (True, work[kind](*args)) if unloaded is None else (False, unloaded)
            )
        except NoPlacementFits as exc:  # the caller's to handle
            reply = (False, exc)
        except Exception as exc:  # a scheduler bug: as text (its arguments may hold numpy)
            reply = (False, _failed(exc))
        _write_frame(replies, pickle.dumps(reply))


def _failed(exc: Exception) -> SearchFailed:
    """What the caller gets of an error in the child: its text and traceback, as plain text
    (the exception's arguments may hold numpy, which the control process never loads)."""
    return SearchFailed(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


def _work() -> dict[str, Callable[..., object]]:
    """What the child answers, by request kind (loaded in the child only: numpy, the scheduler)."""
    from p2ptrain.control.planning import numbers_work, planner

    return {
        "compute_plan": planner.compute_plan,
        "assess": numbers_work.assess,
        "search": numbers_work.search,
    }


if __name__ == "__main__":
    main()
