"""A local training swarm inside the testbed: worker i runs in peer i's namespace, and the plan
is made on the emulated links (what `p2ptrain local --emulate` and `bench e2e` need).

Stdlib + the scheduler (numpy): the workers are separate processes, nothing here imports torch or
hivemind. Each worker listens on its namespace's address (--listen-host).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2ptrain.harness.direct_swarm import LocalSwarm
from p2ptrain.records import Hello, NetworkFacts, Plan, RunSpec
from p2ptrain.schedule.workload import measured_workload, step_traffic
from p2ptrain.testbed.testbed import Testbed
from p2ptrain.worker.settings import DEFAULT_DEVICE, WorkerSettings


def testbed_network(bed: Testbed) -> NetworkFacts:
    """The testbed's links as they are now (worst round trip, slowest rate): what a plan made
    for them states, so the workers' averaging timeouts are scaled for them."""
    links = bed.links().values()
    return NetworkFacts(
        max_rtt_s=round(max((2 * s.delay_ms / 1e3 for s in links), default=0.0), 4),
        min_rate_mbps=round(min((s.rate_mbps for s in links), default=1000.0), 3),
    )


def emulated_topology(bed: Testbed, workload: Any = None) -> Any:
    """The topology the testbed emulates now (scaled delays and rates as the forwarder applies
    them: the bench's ideal run speeds every link up), for the scheduler and the step-time
    model."""
    import numpy as np

    from p2ptrain.schedule import Topology

    n = bed.num_peers
    delay = np.zeros((n, n))
    bandwidth = np.ones((n, n))
    for (a, b), spec in bed.links().items():
        delay[a, b] = spec.delay_ms
        bandwidth[a, b] = spec.rate_mbps / 1000.0
    return Topology(
        peers=list(bed.names), delay_ms=delay, bandwidth_gbps=bandwidth, workload=workload
    )


def predicted_step(
    bed: Testbed,
    spec: RunSpec,
    pipelines: list[list[int]],
    layers: Sequence[int] | None = None,
) -> Any:
    """The step-time model's communication per step for pipelines on the emulated links."""
    from p2ptrain.schedule.step_time import step_time

    topology = emulated_topology(bed)
    traffic = step_traffic(spec, len(pipelines[0]), len(pipelines), layers)
    return step_time(topology.delay_ms, topology.bandwidth_gbps, pipelines, traffic)


def simulated_step(
    bed: Testbed,
    spec: RunSpec,
    pipelines: list[list[int]],
    layers: Sequence[int] | None,
    compute: Any,
) -> float:
    """The step simulated on the emulated links with the stages' measured compute."""
    from p2ptrain.schedule.step_sim import simulated_step_s

    topology = emulated_topology(bed)
    traffic = step_traffic(spec, len(pipelines[0]), len(pipelines), layers)
    return simulated_step_s(topology.delay_ms, topology.bandwidth_gbps, pipelines, traffic, compute)


def plan_on_testbed(
    bed: Testbed,
    spec: RunSpec,
    hellos: list[Hello],
    placement: str = "scheduled",
    seed: int = 0,
) -> tuple[Plan, list[list[int]]]:
    """A plan for the hello'd workers (hello i = peer i of the testbed) and
    its pipelines as peer indices: 'scheduled' asks the scheduler on the emulated links, 'random'
    deals the peers at random. cost_s is the cost model's communication time per step."""
    import numpy as np

    from p2ptrain.schedule import plan_swarm
    from p2ptrain.schedule.baselines import random_pipelines
    from p2ptrain.schedule.cost import CostModel, plan_cost

    peers = [h.peer_id for h in hellos]
    stages = max(1, min(spec.swarm.stages, len(peers), spec.model.n_layer))
    replicas = len(peers) // stages
    workload = measured_workload(spec, stages, replicas)
    topology = emulated_topology(bed, workload)
    if placement == "scheduled":
        scheduled = plan_swarm(topology, stages, replicas, seed=seed, time_budget_s=1.0)
        pipelines = [list(p) for p in scheduled.pipelines]
    elif placement == "random":
        rng = np.random.default_rng(seed)
        pipelines = random_pipelines(len(peers), stages, replicas, rng).tolist()
    else:
        raise ValueError(f"unknown placement {placement!r}")
    cost = plan_cost(CostModel.build(topology, workload), np.array(pipelines))
    used = {i for p in pipelines for i in p}
    plan = Plan(
        term=0,
        epoch=0,
        planner=placement,
        stages=stages,
        pipelines=tuple(tuple(peers[i] for i in p) for p in pipelines),
        spares=tuple(peers[i] for i in range(len(peers)) if i not in used),
        data_addrs={h.peer_id: h.data_addrs for h in hellos},
        cost_s=float(cost.cost_s),
        network=testbed_network(bed),
    )
    return plan, pipelines


class EmulatedSwarm(LocalSwarm):
    """LocalSwarm with worker i inside testbed peer i's namespace, listening on its address."""

    def __init__(
        self, spec: RunSpec, bed: Testbed, workdir: Path, device: str = DEFAULT_DEVICE
    ) -> None:
        flags = {
            i: WorkerSettings(listen_host=bed.address(i)).to_argv() for i in range(bed.num_peers)
        }
        super().__init__(spec, bed.num_peers, workdir, flags, device=device)
        self.bed = bed

    def _command(self, index: int, argv: list[str]) -> list[str]:
        return self.bed.command(index, argv)  # `ip netns exec` execs: the pid is the worker's
