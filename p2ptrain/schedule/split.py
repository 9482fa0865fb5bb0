"""Blocks per stage for a placement (beyond the paper, whose stages are equal).

With measured compute (compute.py) the model's near-equal cut leaves a slow peer's stage the
bottleneck of every GPipe slot. Given the placement, stage j of the plan takes
`f_j(L) = max over replicas i of rows * (block[i, j] * L + embed/head)` for L blocks; all
replicas of a stage hold the same blocks (they average them), so one split serves every
pipeline. `balanced_layers` picks the split (each stage >= 1 block, n_layer in all) whose
slowest stage is the fastest: each f_j grows with L, so handing out the blocks one at a time,
each to the stage that would be fastest with it, reaches the least possible maximum (tested
against every composition). `split_plan` keeps it where the whole cost, communication of the
re-cut stages included, is lower than the even cut's.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from p2ptrain.schedule.compute import PeerCompute
from p2ptrain.schedule.cost import CostModel, IntArray, plan_cost
from p2ptrain.schedule.planner import Schedule
from p2ptrain.schedule.topology import Topology, Workload


class WorkloadFor(Protocol):
    """A run's traffic for a shape and its blocks per stage (empty: the even cut)."""

    def __call__(self, stages: int, replicas: int, layers: Sequence[int] = ()) -> Workload: ...


def stage_times(compute: PeerCompute, pipelines: IntArray, layers: Sequence[int]) -> list[float]:
    """Seconds of one micro-batch of each stage, its slowest replica's, under `layers`."""
    stages = pipelines.shape[1]
    table = compute.stage_table(stages, pipelines.shape[0], layers)
    return [float(table[pipelines[:, j], j].max()) for j in range(stages)]


def balanced_layers(compute: PeerCompute, pipelines: IntArray) -> tuple[int, ...]:
    """Blocks per stage of the placement `pipelines` (R x S peer indices) that minimise its
    slowest stage; () where the model's even cut is as fast (ties keep the even cut)."""
    pipelines = np.asarray(pipelines, dtype=np.intp)
    replicas, stages = pipelines.shape
    n_layer = compute.n_layer
    if stages > n_layer:
        raise ValueError(f"cannot cut {n_layer} layers into {stages} stages")
    filled = compute.filled()
    rows = compute.micro_rows(replicas)
    block = filled.block_row_s[pipelines]  # (R, S)
    fixed = np.zeros_like(block)
    fixed[:, 0] += filled.embed_row_s[pipelines[:, 0]]
    fixed[:, -1] += filled.head_row_s[pipelines[:, -1]]

    def seconds(stage: int, num_layers: int) -> float:
        return rows * float((block[:, stage] * num_layers + fixed[:, stage]).max())

    layers = [1] * stages
    heap = [(seconds(j, 2), j) for j in range(stages)]
    heapq.heapify(heap)
    for _ in range(n_layer - stages):  # each block to the stage fastest with it (ties: first)
        _, j = heapq.heappop(heap)
        layers[j] += 1
        heapq.heappush(heap, (seconds(j, layers[j] + 1), j))
    even = compute.layers_or_even(stages)
    slowest = max(seconds(j, n) for j, n in enumerate(layers))
    if slowest >= max(seconds(j, n) for j, n in enumerate(even)) * (1 - 1e-9):
        return ()
    return tuple(layers)


def split_plan(topology: Topology, plan: Schedule, workload_for: WorkloadFor) -> Schedule:
    """`plan` with the blocks per stage that make its slowest stage fastest, repriced with the
    traffic of that cut (a bigger stage sends bigger gradients), where that is cheaper than the
    even cut; else `plan` as it is. Without measured compute, `plan` as it is."""
    compute = topology.compute
    if compute is None or plan.stages > compute.n_layer:
        return plan
    pipelines = np.array(plan.pipelines, dtype=np.intp)
    layers = balanced_layers(compute, pipelines)
    if not layers:
        return plan
    workload = workload_for(plan.stages, plan.replicas, layers)
    shaped = dataclasses.replace(topology, workload=workload)
    priced = plan_cost(CostModel.build(shaped, workload, layers), pipelines)
    if priced.cost_s >= plan.cost_s:
        return plan
    return dataclasses.replace(
        plan,
        cost_s=priced.cost_s,
        dp_cost_s=priced.dp_cost_s,
        pp_cost_s=priced.pp_cost_s,
        compute_cost_s=priced.compute_cost_s,
        stage_layers=list(layers),
    )
