"""The scheduler's front door: a topology in, a `Schedule` out (peer indices; the live planner
turns it into a placement of peer ids, control/planning/planner.py, then a signed
records.Plan).

Peers are put in a canonical order (by name) before any search, so the schedule does not depend
on the order the peers were listed in; indices are mapped back at the end. The reported cost is always
recomputed from the returned pipelines.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2ptrain.schedule.baselines import identity_assignment, kernighan_lin, random_pipelines
from p2ptrain.schedule.cost import CostModel, IntArray, partition_cost, plan_cost
from p2ptrain.schedule.hybrid import hybrid_search
from p2ptrain.schedule.paper_gcma import paper_search
from p2ptrain.schedule.search_budget import SearchStats
from p2ptrain.schedule.topology import PAPER_WORKLOAD, Topology, TopologyError, Workload

ALGORITHMS = ("hybrid", "paper", "kl", "random", "identity")
DEFAULT_TIME_BUDGET_S = 30.0


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """The scheduler's result: R pipelines of S peer indices (pipelines[i][j]: peer at stage j
    of replica i), the spares, and its cost. Fields in the order of its JSON form."""

    cost_s: float
    dp_cost_s: float
    pp_cost_s: float  # already x2
    compute_cost_s: float = 0.0  # (M + S - 1) x the slowest stage, with measured compute
    stage_layers: list[int] = field(default_factory=list)  # blocks per stage; []: the even cut
    pipelines: list[list[int]]
    spares: list[int]
    wall_s: float
    evaluations: int
    algorithm: str
    seed: int
    stopped: str = "converged"
    peer_names: list[str] = field(default_factory=list)  # in its JSON form as the names below

    @property
    def stages(self) -> int:
        return len(self.pipelines[0])

    @property
    def replicas(self) -> int:
        return len(self.pipelines)

    @property
    def groups(self) -> list[list[int]]:
        """Data-parallel groups: groups[j] = the peers holding stage j."""
        return [list(col) for col in zip(*self.pipelines, strict=True)]

    def to_json(self) -> dict[str, Any]:
        fields = (f.name for f in dataclasses.fields(self) if f.name != "peer_names")
        return {
            **{name: getattr(self, name) for name in fields},
            "stages": self.stages,
            "replicas": self.replicas,
            "groups": self.groups,
            "pipeline_names": [[self.peer_names[p] for p in row] for row in self.pipelines],
            "spare_names": [self.peer_names[p] for p in self.spares],
        }


def resolve_workload(topology: Topology, stages: int | None, replicas: int | None) -> Workload:
    """The workload to plan: the topology's (or the paper's) sizes, stages/replicas overridable."""
    base = topology.workload or PAPER_WORKLOAD
    if stages is None:
        stages = base.stages if replicas is None else max(1, topology.num_peers // replicas)
    if replicas is None:
        same_shape = topology.workload is not None and stages == base.stages
        replicas = base.replicas if same_shape else topology.num_peers // stages
    if stages < 1 or replicas < 1:
        raise TopologyError(f"stages and replicas must be >= 1, got {stages} x {replicas}")
    workload = Workload(stages, replicas, base.c_dp_gb, base.c_pp_gb, base.steps_per_sync)
    topology.check_fits(stages, replicas)
    return workload


def _canonical(topology: Topology, workload: Workload) -> tuple[CostModel, IntArray]:
    order = np.argsort(np.array(topology.peers, dtype=object), kind="stable").astype(np.intp)
    return CostModel.build(topology, workload).reordered(order), order


def plan_swarm(
    topology: Topology,
    stages: int | None = None,
    replicas: int | None = None,
    seed: int = 0,
    algorithm: str = "hybrid",
    time_budget_s: float | None = None,
    max_evaluations: int | None = None,
) -> Schedule:
    """Plan ``stages`` x ``replicas`` tasklets on the topology's peers (extra peers become spares).

    The search stops when it converges, after ``max_evaluations`` cost evaluations (if given: the
    schedule then depends only on the inputs and the seed), or after ``time_budget_s`` seconds
    (default 30), whichever comes first."""
    if algorithm not in ALGORITHMS:
        raise TopologyError(
            f"unknown algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})"
        )
    started = time.perf_counter()
    workload = resolve_workload(topology, stages, replicas)
    model, order = _canonical(topology, workload)
    rng = np.random.default_rng(seed)
    deadline = started + (DEFAULT_TIME_BUDGET_S if time_budget_s is None else time_budget_s)
    stats = SearchStats(max_evaluations=max_evaluations, deadline=deadline)
    stopped = "converged"
    if algorithm == "hybrid":
        state, stopped = hybrid_search(model, rng, stats)
        pipelines = state.plan
    elif algorithm == "paper":
        pipelines, stopped = paper_search(model, rng, stats)
    elif algorithm == "kl":
        pipelines = kernighan_lin(model, rng, stats)
    elif algorithm == "random":
        pipelines = random_pipelines(model.num_peers, model.stages, model.replicas, rng)
    else:
        # identity is about the listed order, so it bypasses the canonical order
        model = CostModel.build(topology, workload)
        order = np.arange(topology.num_peers, dtype=np.intp)
        pipelines = identity_assignment(model)
    evaluation = plan_cost(model, pipelines)
    stats.evaluations += 1
    return _to_schedule(
        topology, evaluation.pipelines, order, workload, algorithm, seed, stopped, stats, started
    )


def _to_schedule(
    topology: Topology,
    pipelines: IntArray,
    order: IntArray,
    workload: Workload,
    algorithm: str,
    seed: int,
    stopped: str,
    stats: SearchStats,
    started: float,
) -> Schedule:
    original = order[pipelines]
    final = plan_cost(CostModel.build(topology, workload), original)  # cost of what we return
    spares = sorted(set(range(topology.num_peers)) - set(original.ravel().tolist()))
    return Schedule(
        pipelines=original.tolist(),
        spares=spares,
        cost_s=final.cost_s,
        dp_cost_s=final.dp_cost_s,
        pp_cost_s=final.pp_cost_s,
        evaluations=stats.evaluations,
        wall_s=time.perf_counter() - started,
        algorithm=algorithm,
        seed=seed,
        stopped=stopped,
        peer_names=list(topology.peers),
        compute_cost_s=final.compute_cost_s,
    )


def evaluate_groups(topology: Topology, groups: object, stages: int | None = None) -> Schedule:
    """Cost of given data-parallel groups (S lists of R peer indices), the rest solved exactly."""
    if (
        not isinstance(groups, list)
        or not groups
        or not all(isinstance(g, list) and g for g in groups)
        or not all(isinstance(p, int) and not isinstance(p, bool) for g in groups for p in g)
    ):
        raise TopologyError("groups must be a non-empty list of non-empty lists of peer indices")
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise TopologyError(f"groups must all have the same size, got sizes {sorted(sizes)}")
    if stages is not None and stages != len(groups):
        raise TopologyError(f"--stages {stages} but the file has {len(groups)} groups")
    flat = [p for g in groups for p in g]
    bad = [p for p in flat if not 0 <= p < topology.num_peers]
    if bad:
        raise TopologyError(f"peer index {bad[0]} is outside 0..{topology.num_peers - 1}")
    if len(set(flat)) != len(flat):
        raise TopologyError("a peer appears in more than one group (or twice in one)")
    started = time.perf_counter()
    workload = resolve_workload(topology, len(groups), sizes.pop())
    model = CostModel.build(topology, workload)
    stats = SearchStats(evaluations=1)
    evaluation = partition_cost(model, np.array(groups, dtype=np.intp))
    identity = np.arange(topology.num_peers, dtype=np.intp)
    return _to_schedule(
        topology, evaluation.pipelines, identity, workload, "evaluate", 0, "exact", stats, started
    )
