"""What a run moves over the network, from its model and wire format (no torch: arithmetic on the
run spec's model fields).

The planner prices plans with these volumes (`planning_workload`), the step-time model predicts a
step from them (`step_traffic`), and the benchmarks compare them with the bytes the workers count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from p2ptrain.records import RunSpec
from p2ptrain.schedule.memory import stage_parameters
from p2ptrain.schedule.step_time import StepTraffic
from p2ptrain.schedule.topology import Workload
from p2ptrain.schedule.wire_bytes import (
    BYTES_PER_VALUE,
    activation_row_bytes,
    gradient_bytes,
    outer_payload_bytes,
)

__all__ = ["BYTES_PER_VALUE"]  # harness/e2e_join.py reads it from here


def dp_exchange_bytes(spec: RunSpec, numel: int) -> float:
    """What one member of a stage's group of `numel` parameters puts in one exchange: its
    compressed pseudo-gradient under diloco, its fp16 (or exact) gradient under step."""
    if spec.optim.sync == "diloco":
        return outer_payload_bytes(spec.wire.outer_compression, numel, spec.wire.topk_fraction)
    return gradient_bytes(spec.wire.compression, numel)


def steps_per_sync(spec: RunSpec) -> int:
    """Steps between a stage group's data-parallel exchanges: H under diloco, else 1."""
    return spec.optim.inner_steps if spec.optim.sync == "diloco" else 1


def replica_batch_rows(spec: RunSpec, replicas: int) -> float:
    """Rows one replica trains a step: `batch_size` of its own under diloco (adding replicas
    adds tokens a step), an even share of the global `batch_size` under step."""
    return (
        float(spec.optim.batch_size)
        if spec.optim.sync == "diloco"
        else spec.optim.batch_size / replicas
    )


def tokens_per_step(spec: RunSpec, replicas: int) -> int:
    """Tokens the swarm trains a step (what shapes are compared by, per second): the run
    spec's rule (RunSpec.tokens_per_step), as the scheduler's callers pass it."""
    return spec.tokens_per_step(replicas)


def stage_parameter_counts(
    spec: RunSpec, stages: int, layers: Sequence[int] | None = None
) -> list[int]:
    """Parameters per stage of the run's model (embeddings on the first stage, the final norm
    and the head on the last), for the traffic model; `layers`: blocks per stage where a plan
    splits them unevenly (default: near-equal)."""
    if not layers:  # None or empty: the even cut (a plan's stage_layers may be empty)
        base, extra = divmod(spec.model.n_layer, stages)
        layers = [base + (1 if s < extra else 0) for s in range(stages)]
    config, counts, start = spec.model_config(), [], 0
    for size in layers:
        counts.append(stage_parameters(config, range(start, start + size)))
        start += size
    return counts


def measured_workload(
    spec: RunSpec, stages: int, replicas: int, layers: Sequence[int] = ()
) -> Workload:
    """The run's real traffic in the scheduler's units: GB of the largest stage's gradients (or
    compressed pseudo-gradient: diloco) per exchange, one exchange every steps_per_sync steps,
    and GB of one replica's activations crossing one boundary (one direction) per step;
    `layers`: blocks per stage of an uneven cut (empty: the even one). A top-k exchange is a
    sparse gather: every link carries each member's whole tensor, R/2 times what the
    all-reduce's 2/R share is, so c_dp counts it that much bigger."""
    counts = stage_parameter_counts(spec, stages, layers or None)
    c_dp_gb = max(dp_exchange_bytes(spec, c) for c in counts) / 1e9
    if sparse_gather(spec):
        c_dp_gb *= max(1.0, replicas / 2)
    tokens = replica_batch_rows(spec, replicas) * spec.model.block_size
    c_pp_gb = tokens * activation_row_bytes(spec.wire.compression, spec.model.n_embd) / 1e9
    return Workload(stages, replicas, c_dp_gb, c_pp_gb, steps_per_sync(spec))


def sparse_gather(spec: RunSpec) -> bool:
    """Does a group exchange by sparse gather (top-k pseudo-gradients) rather than all-reduce?"""
    return spec.optim.sync == "diloco" and spec.wire.outer_compression == "topk"


def planning_workload(
    spec: RunSpec, stages: int, replicas: int, layers: Sequence[int] = ()
) -> Workload:
    """What the live planner prices: the run's real traffic (of the cut `layers`, empty: the
    even one), except where the run spec sets `c_dp_gb` / `c_pp_gb` (0 = from the model and
    wire format, > 0 = the organiser's override)."""
    real = measured_workload(spec, stages, replicas, layers)
    return Workload(
        stages=stages,
        replicas=replicas,
        c_dp_gb=spec.swarm.c_dp_gb or real.c_dp_gb,
        c_pp_gb=spec.swarm.c_pp_gb or real.c_pp_gb,
        steps_per_sync=real.steps_per_sync,
    )


def step_traffic(
    spec: RunSpec, stages: int, replicas: int, layers: Sequence[int] | None = None
) -> StepTraffic:
    """What one step of the run moves, for the step-time model (schedule/step_time.py); under
    diloco each stage's exchange is its compressed pseudo-gradient, once every H steps."""
    rows = math.ceil(replica_batch_rows(spec, replicas))  # the largest replica's rows
    micro_rows = -(-rows // min(spec.optim.micro_batches, rows))  # ... and its largest micro-batch
    row_bytes = activation_row_bytes(spec.wire.compression, spec.model.n_embd)
    return StepTraffic(
        stage_gradient_bytes=tuple(
            dp_exchange_bytes(spec, c) for c in stage_parameter_counts(spec, stages, layers)
        ),
        activation_bytes=float(micro_rows * spec.model.block_size * row_bytes),
        micro_batches=min(spec.optim.micro_batches, rows),
        inner_steps=spec.optim.inner_steps if spec.optim.sync == "diloco" else 0,
        sparse_gather=sparse_gather(spec),
    )
