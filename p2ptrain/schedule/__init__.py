"""The topology-aware scheduler (pure numpy/scipy: no torch, no network).

Public API: ``Topology``, ``Workload``, ``load_topology``, ``plan_swarm``, ``evaluate_groups``,
``Schedule``. See docs/scheduler.md for the model and the algorithm.
"""

from p2ptrain.schedule.planner import ALGORITHMS, Schedule, evaluate_groups, plan_swarm
from p2ptrain.schedule.step_time import StepTime, StepTraffic  # the module: step_time
from p2ptrain.schedule.topology import (
    PAPER_SCENARIOS,
    Topology,
    TopologyError,
    Workload,
    load_topology,
    scenario_path,
    topology_from_json,
)

__all__ = [
    "ALGORITHMS",
    "PAPER_SCENARIOS",
    "Schedule",
    "StepTime",
    "StepTraffic",
    "Topology",
    "TopologyError",
    "Workload",
    "evaluate_groups",
    "load_topology",
    "plan_swarm",
    "scenario_path",
    "topology_from_json",
]
