"""The peers' measured stage times, for the planner (when the run spec's compute_aware is set).

Each worker times the run's model once (worker/compute_probe.py) and its node announces it in its
peer record; here those records become the scheduler's per-peer compute vector. A peer that has
not measured yet gets the median of those that did (schedule/compute.py), like an unmeasured link.

A peer's word on its speed is evidence, not authority (issue 26.9): no claim counts for less
than the run's model takes on a device of MAX_DEVICE_FLOPS, and a peer whose pipeline steps run
slower than its plan predicted is priced that much slower (trust.py: ComputeTrust). Runs in the
planning child (numbers_work.py), as numpy does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from p2ptrain.records import RunSpec, StageCompute

if TYPE_CHECKING:
    from p2ptrain.schedule.compute import PeerCompute


# dense FLOP/s no single device reaches (the fastest GPUs of 2025 do ~2-5e15 in 16 or 8 bits):
# a claim faster than this on the run's model is a lie, priced at this speed
MAX_DEVICE_FLOPS = 1e16


def fastest_row_s(run: RunSpec) -> tuple[float, float, float]:
    """The least seconds per row (block, embedding, head) any device may claim on the run's
    model: forward and backward of each parameter, 6 FLOP per token, at MAX_DEVICE_FLOPS."""
    from p2ptrain.schedule.memory import block_parameters, head_parameters

    config = run.model_config()
    per_param_s = 6 * config.block_size / MAX_DEVICE_FLOPS
    # the embedding is a lookup, not a product: only the record's floor holds it
    return block_parameters(config) * per_param_s, 0.0, head_parameters(config) * per_param_s


def peer_compute(
    peers: list[str],
    measured: Mapping[str, StageCompute | None],
    run: RunSpec,
    slowdown: Mapping[str, float] | None = None,
) -> PeerCompute | None:
    """The compute vector of `peers` in that order; None (the paper's communication-only cost)
    when the run is not compute-aware or no peer has timed this run's model yet. No claim is
    faster than fastest_row_s; `slowdown` (ComputeTrust.factors) multiplies a peer's times."""
    from p2ptrain.schedule.compute import PeerCompute

    if not run.swarm.compute_aware:
        return None
    floor = np.array(fastest_row_s(run))
    times = np.full((3, len(peers)), np.nan)
    for i, peer in enumerate(peers):
        compute = measured.get(peer)
        if compute is not None and compute.run_id == run.run_id:
            claimed = np.array((compute.block_row_s, compute.embed_row_s, compute.head_row_s))
            factor = (slowdown or {}).get(peer, 1.0)
            times[:, i] = np.maximum(claimed, floor) * factor
    if np.isnan(times[0]).all():
        return None
    memory = np.array([_memory(measured.get(peer), run) for peer in peers], dtype=float)
    return PeerCompute(
        times[0],
        times[1],
        times[2],
        run.model.n_layer,
        run.optim.batch_size,
        run.optim.micro_batches,
        memory_bytes=memory,
        stage_bytes=RunStageBytes(run),
        batch_per_replica=run.optim.sync == "diloco",
    )


def _memory(compute: StageCompute | None, run: RunSpec) -> float:
    """A peer's device memory for this run's plans (NaN: not known)."""
    if compute is None or compute.run_id != run.run_id or compute.memory_bytes <= 0:
        return float("nan")
    return float(compute.memory_bytes)


@dataclass(frozen=True)
class RunStageBytes:
    """What each stage of a (stages, replicas, blocks per stage) plan of `run` needs to train
    (schedule/memory.py): its weights, gradients, AdamW state, the activations of its
    replica's micro-batches (the largest replica's, rounded up) and DiLoCo's outer state. A class, not a closure: it
    travels to the search process (control/planning/search_process.py) pickled."""

    run: RunSpec

    def __call__(self, stages: int, replicas: int, sizes: Sequence[int]) -> list[float]:
        from p2ptrain.schedule.memory import stage_memory
        from p2ptrain.schedule.workload import replica_batch_rows

        run, config = self.run, self.run.model_config()
        rows = math.ceil(math.ceil(replica_batch_rows(run, replicas)) / run.optim.micro_batches)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        return [
            float(
                stage_memory(
                    config,
                    range(starts[j], starts[j + 1]),
                    rows,
                    run.optim.micro_batches,
                    diloco=run.optim.sync == "diloco",
                ).total_bytes
            )
            for j in range(stages)
        ]
