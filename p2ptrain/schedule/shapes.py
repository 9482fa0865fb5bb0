"""Choosing the plan's shape (stages x replicas) when peers differ in speed.

With equal peers the run's stage count and as many replicas as fit is the natural shape. With
measured compute (compute.py) a few slow peers gate every GPipe step, and a shape that leaves
them out can be cheaper: fewer replicas (each carrying more rows of the fixed global batch) or
fewer stages (each holding more layers), the slow peers becoming spares. Each candidate shape is
planned with the same search, its layers split so that its slowest stage is fastest (split.py),
and the plan with the most tokens a second wins: its step priced with compute by the paper's
cost, or, given a step model, simulated as the data plane runs it (step_sim.py;
`simulated_step_model`), over the tokens a step of its shape trains (the same for every shape
under sync = "step"; R x batch_size rows under "diloco", so a replica that adds more tokens than
it slows the step pays for itself). The paper's
cost ranks placements of one shape well, but not shapes against each other: on the bench's
network it priced 1 x 4 peers at 1.53 s and 2 x 4 at 1.38 s where they ran 1.21 s and 1.8 s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from p2ptrain.schedule.compute import PeerCompute
from p2ptrain.schedule.planner import Schedule, plan_swarm
from p2ptrain.schedule.split import WorkloadFor, split_plan
from p2ptrain.schedule.step_sim import MeasuredCompute, simulated_step_s
from p2ptrain.schedule.step_time import StepTraffic
from p2ptrain.schedule.topology import Topology, Workload

# seconds of a plan's step on a topology: what shapes are compared by
StepModel = Callable[[Schedule, Topology], float]
# tokens a step of a plan of so many replicas trains
TokensPerStep = Callable[[int], float]
# forward : backward of a transformer's micro-batch (the backward computes two products per
# forward one); the probe times them together
FORWARD_SHARE = 1.0 / 3.0

FloatArray = npt.NDArray[np.float64]


def scaled_workload(base: Workload) -> WorkloadFor:
    """The base workload re-cut for another shape: a stage's gradients grow with its layers
    (c_dp x S0 / S, and for an uneven cut x its largest stage's blocks over the even cut's) and
    a replica's activations with its rows of the global batch (c_pp x R0 / R)."""

    def workload_for(stages: int, replicas: int, layers: Sequence[int] = ()) -> Workload:
        largest = max(layers) / -(-sum(layers) // stages) if layers else 1.0
        return Workload(
            stages,
            replicas,
            base.c_dp_gb * base.stages / stages * largest,
            base.c_pp_gb * base.replicas / replicas,
            base.steps_per_sync,
        )

    return workload_for


# a shape may leave out the peers slower than these multiples of the lower quartile of the
# measured: not less than 3x, so that timing noise among equal peers never shrinks the plan (8
# workers starting at once on 2 cores timed the same model up to 3.6x apart)
SLOWDOWN_CUTS = (3.0, 6.0)
# ... and a shape other than the first (the run's own, everyone placed) must beat it by this
# factor: equal peers timed on a busy machine can differ by 2x, and placing fewer peers than
# could train is a choice worth making only when it clearly pays
SHAPE_GAIN = 0.8
# stage counts priced one by one up to this many (beyond: halved), each a search of its own
MAX_EVERY_STAGES = 8


def candidate_shapes(
    num_peers: int,
    max_stages: int,
    n_layer: int,
    block_row_s: FloatArray | None = None,
    fewer_replicas: bool = False,
) -> list[tuple[int, int]]:
    """A few stages x replicas worth pricing, the run's own shape (max_stages, as many replicas
    as fit) first: stages halved down to 1, and every count up to MAX_EVERY_STAGES (3 stages of
    4 layers are as good a shape as 2 or 4 now that stages may hold unequal layers); replicas
    as many as fit, or as many as fit among the peers within each of SLOWDOWN_CUTS of the lower
    quartile (block_row_s, measured or estimated), and with `fewer_replicas` also halved down
    to 1 (where averaging over slow links costs more than the rows it shares: for a step model
    that prices averaging as it runs, simulated_step_model)."""
    top = max(1, min(max_stages, n_layer, num_peers))
    counts = [num_peers]
    if block_row_s is not None and len(block_row_s) and block_row_s.min() > 0:
        # the lower quartile, not the fastest: one peer timed in a quiet moment must not make
        # its equals look slow (SLOWDOWN_CUTS)
        typical = float(np.quantile(block_row_s, 0.25))
        counts += [int(np.count_nonzero(block_row_s <= cut * typical)) for cut in SLOWDOWN_CUTS]
    halved = {top}
    while min(halved) > 1:
        halved.add(min(halved) // 2)
    stage_counts = sorted(halved | set(range(1, min(top, MAX_EVERY_STAGES) + 1)), reverse=True)
    shapes: list[tuple[int, int]] = []
    for stages in stage_counts:
        replicas = [count // stages for count in counts]
        if fewer_replicas:
            while replicas[-1] > 1:
                replicas.append(replicas[-1] // 2)
        for shape in ((stages, r) for r in replicas):
            if shape[1] >= 1 and shape not in shapes:
                shapes.append(shape)
    return shapes


def simulated_step_model(
    traffic_for: Callable[[int, int, Sequence[int]], StepTraffic], compute: PeerCompute
) -> StepModel:
    """A step model from the run's traffic (stages, replicas, layers -> StepTraffic) and the
    peers' measured compute: each placed peer computes its stage's micro-batches at its own
    timed speed (a third forward, two thirds backward), the links are the topology's."""

    def step_s(plan: Schedule, topology: Topology) -> float:
        stages, replicas = plan.stages, plan.replicas
        table = compute.filled().stage_table(stages, replicas, plan.stage_layers or None)
        per_micro = [[float(table[p, j]) for j, p in enumerate(pipe)] for pipe in plan.pipelines]
        timed = MeasuredCompute(
            forward_s=[[t * FORWARD_SHARE for t in row] for row in per_micro],
            backward_s=[[t * (1 - FORWARD_SHARE) for t in row] for row in per_micro],
            update_s=[[0.0] * stages for _ in range(replicas)],
        )
        traffic = traffic_for(stages, replicas, plan.stage_layers)
        return simulated_step_s(
            topology.delay_ms, topology.bandwidth_gbps, plan.pipelines, traffic, timed
        )

    return step_s


def plan_best_shape(
    topology: Topology,
    shapes: Sequence[tuple[int, int]],
    workload_for: WorkloadFor,
    seed: int = 0,
    time_budget_s: float | None = None,
    max_evaluations: int | None = None,
    step_model: StepModel | None = None,
    tokens_per_step: TokensPerStep | None = None,
) -> Schedule:
    """The plan of every shape with the fewest seconds a token (ties: the earlier shape), each
    searched with ``plan_swarm`` on its own workload (each with the whole evaluation budget: a
    smaller shape converges sooner; the time cap is shared evenly), then given the layer split
    that makes its slowest stage fastest where that is cheaper (split.py). A step's seconds by
    `step_model` where given, else by the plans' cost; its tokens by `tokens_per_step` (of the
    replicas; None: every shape trains the same global batch). A shape after the first wins
    only below SHAPE_GAIN x the first shape's seconds a token."""
    if not shapes:
        raise ValueError("no shape to plan")
    budget = None if time_budget_s is None else time_budget_s / len(shapes)
    best: Schedule | None = None
    best_cost = first_cost = 0.0
    for stages, replicas in shapes:
        shaped = dataclasses.replace(topology, workload=workload_for(stages, replicas))
        plan = plan_swarm(
            shaped,
            stages,
            replicas,
            seed=seed,
            time_budget_s=budget,
            max_evaluations=max_evaluations,
        )
        plan = split_plan(shaped, plan, workload_for)
        step_s = plan.cost_s if step_model is None else step_model(plan, topology)
        cost = step_s / (1.0 if tokens_per_step is None else tokens_per_step(replicas))
        if best is None:
            best, best_cost, first_cost = plan, cost, cost
        elif cost < min(best_cost - 1e-12, SHAPE_GAIN * first_cost):
            best, best_cost = plan, cost
    assert best is not None
    return best
