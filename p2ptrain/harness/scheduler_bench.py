"""The scheduler benchmark: the paper's five scenarios with every algorithm, and a scaling series."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2ptrain.schedule.cost import CostModel, plan_cost
from p2ptrain.schedule.planner import plan_swarm
from p2ptrain.schedule.synthetic import city_topology
from p2ptrain.schedule.topology import PAPER_SCENARIOS, Topology, load_topology, scenario_path

# What the authors' own scheduler reached when run here (seeded, its default 5,000 evaluations).
AUTHORS_COST_S = {
    "datacenter_on_demand": 3.4398,
    "datacenter_spot": 49.5039,
    "multi_datacenter": 16.0868,
    "regional": 34.8020,
    "worldwide": 49.2184,
}
PAPER_BUDGET_S = 300.0
SCALING_SERIES = ((64, 8, 8), (128, 8, 16), (256, 16, 16), (512, 16, 32), (1024, 16, 64))


@dataclass(frozen=True)
class Row:
    case: str
    algorithm: str
    cost_s: float
    wall_s: float
    evaluations: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def shuffled(topology: Topology, seed: int) -> Topology:
    """The same swarm with its peers listed in another order."""
    perm = np.random.default_rng(seed).permutation(topology.num_peers)
    ix = np.ix_(perm, perm)
    return Topology(
        peers=[topology.peers[p] for p in perm],
        delay_ms=topology.delay_ms[ix],
        bandwidth_gbps=topology.bandwidth_gbps[ix],
        regions=[topology.regions[p] for p in perm] if topology.regions else None,
        workload=topology.workload,
        name=topology.name,
    )


def region_sorted_cost(topology: Topology) -> float:
    """Baseline: peers sorted by region, pipelines filled in that order."""
    assert topology.workload is not None
    w = topology.workload
    order = sorted(
        range(topology.num_peers), key=lambda p: (topology.region_of(p), topology.peers[p])
    )
    plan = np.array(order[: w.stages * w.replicas]).reshape(w.replicas, w.stages)
    return plan_cost(CostModel.build(topology, w), plan).cost_s


def run_case(
    case: str,
    topology: Topology,
    algorithms: list[str],
    time_budget_s: float,
    progress: Callable[[str], None],
) -> list[Row]:
    rows = []
    for algorithm in algorithms:
        progress(f"{case}: {algorithm}")
        # the paper's GCMA runs its fixed 5,000 evaluations (the budget is only a safety net)
        budget = PAPER_BUDGET_S if algorithm == "paper" else time_budget_s
        plan = plan_swarm(topology, seed=0, algorithm=algorithm, time_budget_s=budget)
        rows.append(Row(case, algorithm, plan.cost_s, plan.wall_s, plan.evaluations))
    return rows


def run_benchmark(
    with_paper: bool,
    scaling_sizes: list[int],
    time_budget_s: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    algorithms = ["hybrid", "kl", "random", "identity"] + (["paper"] if with_paper else [])
    scenarios = []
    for name in PAPER_SCENARIOS:
        topology = load_topology(scenario_path(name))
        rows = run_case(name, topology, algorithms, time_budget_s, progress)
        progress(f"{name}: hybrid on shuffled peers")
        started = time.perf_counter()
        shuffled_plan = plan_swarm(shuffled(topology, 1), seed=0, time_budget_s=time_budget_s)
        scenarios.append(
            {
                "scenario": name,
                "authors_cost_s": AUTHORS_COST_S[name],
                "shuffled_cost_s": shuffled_plan.cost_s,
                "shuffled_wall_s": time.perf_counter() - started,
                "rows": [r.to_json() for r in rows],
            }
        )
    scaling = []
    for num_peers, stages, replicas in SCALING_SERIES:
        if num_peers not in scaling_sizes:
            continue
        topology = city_topology(num_peers, stages, replicas, seed=0)
        rows = run_case(f"cities-{num_peers}", topology, ["hybrid", "random"], 30.0, progress)
        scaling.append(
            {
                "peers": num_peers,
                "stages": stages,
                "replicas": replicas,
                "region_sorted_cost_s": region_sorted_cost(topology),
                "rows": [r.to_json() for r in rows],
            }
        )
    return {"benchmark": "scheduler", "scenarios": scenarios, "scaling": scaling}


def render(result: dict[str, Any]) -> str:
    lines = [
        "Paper scenarios (64 peers, 8 stages x 8 replicas); cost in s/iteration",
        f"{'scenario':22s} {'algorithm':9s} {'cost_s':>9s} {'wall_s':>7s} {'evals':>9s} "
        f"{'vs authors':>10s} {'random/x':>9s} {'identity/x':>10s} {'kl/x':>6s}",
    ]
    for sc in result["scenarios"]:
        by_alg = {r["algorithm"]: r for r in sc["rows"]}
        for r in sc["rows"]:
            lines.append(
                f"{sc['scenario']:22s} {r['algorithm']:9s} {r['cost_s']:9.4f} {r['wall_s']:7.2f} "
                f"{r['evaluations']:9d} {r['cost_s'] / sc['authors_cost_s']:10.3f} "
                f"{by_alg['random']['cost_s'] / r['cost_s']:9.2f} "
                f"{by_alg['identity']['cost_s'] / r['cost_s']:10.2f} {by_alg['kl']['cost_s'] / r['cost_s']:6.2f}"
            )
        lines.append(
            f"{'':22s} authors' scheduler {sc['authors_cost_s']:.4f}; hybrid on shuffled peers "
            f"{sc['shuffled_cost_s']:.4f} in {sc['shuffled_wall_s']:.2f} s"
        )
    if result["scaling"]:
        lines += [
            "",
            "Scaling (peers in the 10 cities of region_links.json)",
            f"{'peers':>6s} {'S x R':>8s} {'hybrid_s':>9s} {'wall_s':>7s} {'evals':>10s} "
            f"{'random_s':>9s} {'random/x':>9s} {'sorted_s':>9s} {'sorted/x':>9s}",
        ]
        for sc in result["scaling"]:
            by_alg = {r["algorithm"]: r for r in sc["rows"]}
            h, rnd = by_alg["hybrid"], by_alg["random"]
            lines.append(
                f"{sc['peers']:6d} {sc['stages']:>3d} x {sc['replicas']:<3d} {h['cost_s']:9.3f} {h['wall_s']:7.2f} "
                f"{h['evaluations']:10d} {rnd['cost_s']:9.3f} {rnd['cost_s'] / h['cost_s']:9.2f} "
                f"{sc['region_sorted_cost_s']:9.3f} {sc['region_sorted_cost_s'] / h['cost_s']:9.2f}"
            )
    return "\n".join(lines)
