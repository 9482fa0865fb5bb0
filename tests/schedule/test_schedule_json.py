"""The scheduler's JSON forms are contracts (`p2ptrain schedule --json`, `bench scheduler`): their
keys, in order, stay as they were when the result type became `Schedule` and the bench rows
dataclass-derived."""

from p2ptrain.harness.scheduler_bench import Row
from p2ptrain.schedule import plan_swarm
from p2ptrain.schedule.synthetic import city_topology

SCHEDULE_KEYS = [
    "cost_s",
    "dp_cost_s",
    "pp_cost_s",
    "compute_cost_s",
    "stage_layers",
    "pipelines",
    "spares",
    "wall_s",
    "evaluations",
    "algorithm",
    "seed",
    "stopped",
    "stages",
    "replicas",
    "groups",
    "pipeline_names",
    "spare_names",
]


def test_the_schedule_json_keeps_its_keys_and_order() -> None:
    topology = city_topology(6, 2, 2, seed=0)
    schedule = plan_swarm(topology, seed=0, algorithm="random")
    data = schedule.to_json()
    assert list(data) == SCHEDULE_KEYS
    assert data["pipeline_names"] == [[topology.peers[p] for p in r] for r in data["pipelines"]]
    assert data["spare_names"] == [topology.peers[p] for p in data["spares"]]
    assert len(data["spares"]) == 2 and data["groups"] == schedule.groups


def test_a_bench_row_keeps_its_keys() -> None:
    row = Row("case", "hybrid", 1.5, 0.25, 10).to_json()
    assert row == {
        "case": "case",
        "algorithm": "hybrid",
        "cost_s": 1.5,
        "wall_s": 0.25,
        "evaluations": 10,
    }
    assert list(row) == ["case", "algorithm", "cost_s", "wall_s", "evaluations"]
