"""The topology-aware scheduler (pure numpy/scipy: no torch, no network).

Public API: ``Topology``, ``Workload``, ``load_topology``, ``plan_swarm``, ``evaluate_groups``,
``Schedule``. See docs/scheduler.md for the model and the algorithm.

The names load on first use: the package's pure-Python modules (memory.py, handover_time.py)
serve control processes that never plan, and must not bring numpy and scipy with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2ptrain.schedule.planner import ALGORITHMS, Schedule, evaluate_groups, plan_swarm
    from p2ptrain.schedule.step_time import StepTime, StepTraffic
    from p2ptrain.schedule.topology import (
        PAPER_SCENARIOS,
        Topology,
        TopologyError,
        Workload,
        load_topology,
        scenario_path,
        topology_from_json,
    )

_HOMES = {
    "ALGORITHMS": "planner",
    "Schedule": "planner",
    "evaluate_groups": "planner",
    "plan_swarm": "planner",
    "StepTime": "step_time",
    "StepTraffic": "step_time",
    "PAPER_SCENARIOS": "topology",
    "Topology": "topology",
    "TopologyError": "topology",
    "Workload": "topology",
    "load_topology": "topology",
    "scenario_path": "topology",
    "topology_from_json": "topology",
}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'p2ptrain.schedule' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"p2ptrain.schedule.{home}"), name)
    globals()[name] = value
    return value
