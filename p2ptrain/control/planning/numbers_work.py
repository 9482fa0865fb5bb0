"""The planning child's side of numbers.py: numpy and the scheduler, never in a control process.

Each request rebuilds the live matrices from plain inputs (estimate/matrix.py, with the fitted
embedding, which is remembered while this process lives) or takes them back pickled, and answers
with plain records: what crosses back must not make the control process load numpy to read it.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np

from p2ptrain.control.estimate.matrix import live_matrices
from p2ptrain.control.planning import planner
from p2ptrain.control.planning.compute import peer_compute
from p2ptrain.control.planning.numbers import Assessment, PlanInputs, Searched
from p2ptrain.control.planning.placement import NoPlacementFits
from p2ptrain.records import Plan


def matrices_of(inputs: PlanInputs) -> planner.Matrices:
    """The matrices the scheduler plans on: links as measured, estimated elsewhere, with the
    members' compute (None unless the run is compute-aware and some member timed it)."""
    members = list(inputs.members)
    estimated = live_matrices(
        members, inputs.links, inputs.coords, inputs.capacities, inputs.private, inputs.relayed
    )
    compute = peer_compute(members, inputs.measured, inputs.run, inputs.slowdown)
    return dataclasses.replace(estimated.matrices, compute=compute)


def assess(inputs: PlanInputs, plan: Plan | None) -> Assessment:
    """`plan` priced on the live matrices."""
    matrices = matrices_of(inputs)
    return Assessment(pickle.dumps(matrices), _plan_cost(matrices, plan, inputs))


def search(inputs: PlanInputs, matrices_pickled: bytes | None, plan: Plan | None) -> Searched:
    """A placement on the live matrices (or on `matrices_pickled`, an assessment's), with the
    network facts its plan carries and `plan`, the standing one, priced on the same."""
    matrices = matrices_of(inputs) if matrices_pickled is None else pickle.loads(matrices_pickled)
    cost_s = _plan_cost(matrices, plan, inputs)
    try:
        placement = planner.compute_plan(matrices, inputs.run)
    except NoPlacementFits as exc:
        return Searched(None, str(exc), None, cost_s, summary(matrices))
    network = planner.network_facts(matrices, placement.pipelines)
    return Searched(placement, "", network, cost_s, summary(matrices))


def _plan_cost(matrices: planner.Matrices, plan: Plan | None, inputs: PlanInputs) -> float | None:
    if plan is None:
        return None
    return planner.placement_cost(matrices, plan.pipelines, inputs.run, plan.stage_layers)


def summary(matrices: planner.Matrices) -> str:
    """How many links were measured, and the range of the rest, for the plan's log line."""
    upper = np.triu_indices(len(matrices.peers), k=1)
    delays = matrices.delay_ms[upper] if upper[0].size else np.zeros(1)
    rates = matrices.bandwidth_gbps[upper] * 1e3 if upper[0].size else np.zeros(1)
    return (
        f"{matrices.num_measured_delays} of {len(upper[0])} links measured; one-way delay "
        f"{delays.min():.1f}-{delays.max():.1f} ms, {rates.min():.1f}-{rates.max():.1f} Mbit/s"
    )
