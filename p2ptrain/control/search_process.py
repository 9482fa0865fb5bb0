"""The scheduler's search runs in a process of its own, not a thread of the control process.

The search is Python and numpy under the GIL for up to tens of thousands of cost evaluations: in
a thread it starved the control process's trio loop on a loaded machine, its gossip stopped for
longer than DEAD_AFTER_S and the swarm deposed the planner for planning. One spawned process
(not forked: the control process runs trio and libp2p) is kept for the node's lifetime; it
exits with its parent's pipe.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import trio

from p2ptrain.control import planner
from p2ptrain.records import RunSpec

log = logging.getLogger(__name__)

_pool: ProcessPoolExecutor | None = None


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    return _pool


def _plan_in_process(matrices: planner.Matrices, run: RunSpec) -> planner.Placement:
    """Runs in the control process's thread: waits on the search process (GIL released)."""
    global _pool
    try:
        return _executor().submit(planner.compute_plan, matrices, run).result()
    except BrokenProcessPool:  # the search process died (killed, out of memory): a fresh one
        _pool = None
        raise


async def compute_plan(matrices: planner.Matrices, run: RunSpec) -> planner.Placement:
    """planner.compute_plan, in the search process."""
    return await trio.to_thread.run_sync(_plan_in_process, matrices, run)
