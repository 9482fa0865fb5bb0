"""The live planner gives the same plan for the same measurements on an idle machine and on a
busy one: its search is bounded by evaluations, not by wall time (control/planning/planner.py)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from p2ptrain.control.planning.planner import Matrices, Placement, compute_plan
from p2ptrain.records import RunSpec
from p2ptrain.schedule.synthetic import city_topology

NUM_BUSY = 4

# real processes spinning on every core: run alone (the serial stage), not beside the unit
# tests, whose timing it would steal
pytestmark = pytest.mark.integration


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(num: int) -> Iterator[None]:
    """`num` processes that spin on a CPU each until the block ends."""
    context = multiprocessing.get_context("fork")  # a bare loop: nothing to re-import
    procs = [context.Process(target=_spin, daemon=True) for _ in range(num)]
    for proc in procs:
        proc.start()
    try:
        time.sleep(0.2)  # let them take the cores
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.join()


def _plans() -> list[Placement]:
    plans = []
    for num_peers, stages, seed in ((8, 4, 0), (16, 4, 1)):
        topology = city_topology(num_peers, stages, num_peers // stages, seed=seed)
        n = topology.num_peers
        matrices = Matrices(list(topology.peers), topology.delay_ms, topology.bandwidth_gbps, n)
        plans.append(compute_plan(matrices, RunSpec().replace(stages=stages)))
    return plans


def test_the_same_measurements_give_the_same_plan_at_load_0_and_at_load_4() -> None:
    idle = _plans()
    with busy(NUM_BUSY):
        loaded = _plans()
    assert [p.pipelines for p in loaded] == [p.pipelines for p in idle]
    assert [p.spares for p in loaded] == [p.spares for p in idle]
    assert [p.cost_s for p in loaded] == [p.cost_s for p in idle]
