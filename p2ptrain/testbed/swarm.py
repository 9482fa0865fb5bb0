"""A local training swarm inside the testbed: worker i runs in peer i's namespace, and the plan
is made on the emulated links (what `p2ptrain local --emulate` and `bench e2e` need).

Stdlib + the scheduler (numpy): the workers are separate processes, nothing here imports torch or
hivemind. The worker must listen on its namespace's address: it reads LISTEN_HOST_ENV.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from p2ptrain.runspec import RunSpec
from p2ptrain.testbed.testbed import Testbed
from p2ptrain.worker.local_swarm import LocalSwarm

LISTEN_HOST_ENV = "P2PTRAIN_LISTEN_HOST"  # the worker's p2pd listens on /ip4/$it/tcp/0
BYTES_PER_VALUE = {"fp16": 2, "bf16": 2, "none": 4}


def emulated_topology(bed: Testbed, workload: Any = None) -> Any:
    """The topology the testbed emulates (scaled delays and rates), for the scheduler."""
    import numpy as np

    from p2ptrain.schedule import Topology

    n = bed.num_peers
    delay = np.zeros((n, n))
    bandwidth = np.ones((n, n))
    for (a, b), spec in bed.configured.items():
        delay[a, b] = spec.delay_ms
        bandwidth[a, b] = spec.rate_mbps / 1000.0
    return Topology(
        peers=list(bed.names), delay_ms=delay, bandwidth_gbps=bandwidth, workload=workload
    )


def stage_parameter_counts(spec: RunSpec, stages: int) -> list[int]:
    """Parameters per stage of the nanoGPT-style model (embeddings on the first stage, the
    final norm and the head on the last), for the traffic model."""
    d, layers = spec.n_embd, spec.n_layer
    per_layer = 12 * d * d + 13 * d  # attention 4d^2+4d, MLP 8d^2+5d, two layer norms 4d
    base, extra = divmod(layers, stages)
    counts = [(base + (1 if s < extra else 0)) * per_layer for s in range(stages)]
    counts[0] += spec.vocab_size * d + spec.block_size * d
    counts[-1] += 2 * d + spec.vocab_size * d
    return counts


def measured_workload(spec: RunSpec, stages: int, replicas: int) -> Any:
    """The run's real traffic in the scheduler's units: GB of the largest stage's gradients, and
    GB of one replica's activations crossing one boundary (one direction) per step."""
    from p2ptrain.schedule import Workload

    value_bytes = BYTES_PER_VALUE.get(spec.compression, 4)
    c_dp_gb = max(stage_parameter_counts(spec, stages)) * value_bytes / 1e9
    rows_per_replica = spec.batch_size / replicas
    c_pp_gb = rows_per_replica * spec.block_size * spec.n_embd * value_bytes / 1e9
    return Workload(stages=stages, replicas=replicas, c_dp_gb=c_dp_gb, c_pp_gb=c_pp_gb)


def plan_on_testbed(
    bed: Testbed,
    spec: RunSpec,
    hellos: list[dict[str, Any]],
    placement: str = "scheduled",
    seed: int = 0,
) -> tuple[dict[str, Any], list[list[int]]]:
    """A plan body (contracts.md) for the hello'd workers (hello i = peer i of the testbed) and
    its pipelines as peer indices: 'scheduled' asks the scheduler on the emulated links, 'random'
    deals the peers at random. cost_s is the cost model's communication time per step."""
    import numpy as np

    from p2ptrain.schedule import plan_swarm
    from p2ptrain.schedule.cost import CostModel, plan_cost

    peers = [h["peer_id"] for h in hellos]
    stages = max(1, min(spec.stages, len(peers), spec.n_layer))
    replicas = len(peers) // stages
    workload = measured_workload(spec, stages, replicas)
    topology = emulated_topology(bed, workload)
    if placement == "scheduled":
        plan = plan_swarm(topology, stages, replicas, seed=seed, time_budget_s=1.0)
        pipelines = [list(p) for p in plan.pipelines]
    elif placement == "random":
        order = np.random.default_rng(seed).permutation(len(peers)).tolist()
        pipelines = [order[r * stages : (r + 1) * stages] for r in range(replicas)]
    else:
        raise ValueError(f"unknown placement {placement!r}")
    cost = plan_cost(CostModel.build(topology, workload), np.array(pipelines))
    used = {i for p in pipelines for i in p}
    body = {
        "term": 0,
        "epoch": 0,
        "planner": placement,
        "stages": stages,
        "pipelines": [[peers[i] for i in p] for p in pipelines],
        "spares": [peers[i] for i in range(len(peers)) if i not in used],
        "data_addrs": {h["peer_id"]: h["data_addrs"] for h in hellos},
        "cost_s": float(cost.cost_s),
    }
    return body, pipelines


class EmulatedSwarm(LocalSwarm):
    """LocalSwarm with worker i inside testbed peer i's namespace, listening on its address."""

    def __init__(self, spec: RunSpec, bed: Testbed, workdir: Path) -> None:
        env = {i: {LISTEN_HOST_ENV: bed.address(i)} for i in range(bed.num_peers)}
        super().__init__(spec, bed.num_peers, workdir, env)
        self.bed = bed

    def _start_worker(self, index: int, ipc_path: str) -> None:
        # Same as LocalSwarm's, wrapped in `ip netns exec` (which execs: the pid is the worker's).
        import os

        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env.get(index, {})}
        argv = [sys.executable, "-m", "p2ptrain.worker", "--ipc", ipc_path]
        with open(self.workdir / f"worker-{index}.log", "wb") as log:
            proc = subprocess.Popen(
                self.bed.command(index, argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        self.procs.append(proc)
