"""What a run moves over the network, from its model and wire format (no torch: arithmetic on the
run spec's model fields).

The planner prices plans with these volumes (`planning_workload`), the step-time model predicts a
step from them (`step_traffic`), and the benchmarks compare them with the bytes the workers count.
"""

from __future__ import annotations

from collections.abc import Sequence

from p2ptrain.records import RunSpec
from p2ptrain.schedule.memory import stage_parameters
from p2ptrain.schedule.step_time import StepTraffic
from p2ptrain.schedule.topology import Workload

# bytes of one value on the wire, by the run spec's `compression` (activations and gradients)
BYTES_PER_VALUE = {"fp16": 2, "bf16": 2, "none": 4}


def stage_parameter_counts(
    spec: RunSpec, stages: int, layers: Sequence[int] | None = None
) -> list[int]:
    """Parameters per stage of the run's model (embeddings on the first stage, the final norm
    and the head on the last), for the traffic model; `layers`: blocks per stage where a plan
    splits them unevenly (default: near-equal)."""
    if not layers:  # None or empty: the even cut (a plan's stage_layers may be empty)
        base, extra = divmod(spec.n_layer, stages)
        layers = [base + (1 if s < extra else 0) for s in range(stages)]
    config, counts, start = spec.model_config(), [], 0
    for size in layers:
        counts.append(stage_parameters(config, range(start, start + size)))
        start += size
    return counts


def measured_workload(
    spec: RunSpec, stages: int, replicas: int, layers: Sequence[int] = ()
) -> Workload:
    """The run's real traffic in the scheduler's units: GB of the largest stage's gradients, and
    GB of one replica's activations crossing one boundary (one direction) per step; `layers`:
    blocks per stage of an uneven cut (empty: the even one)."""
    value_bytes = BYTES_PER_VALUE.get(spec.compression, 4)
    counts = stage_parameter_counts(spec, stages, layers or None)
    c_dp_gb = max(counts) * value_bytes / 1e9
    rows_per_replica = spec.batch_size / replicas
    c_pp_gb = rows_per_replica * spec.block_size * spec.n_embd * value_bytes / 1e9
    return Workload(stages=stages, replicas=replicas, c_dp_gb=c_dp_gb, c_pp_gb=c_pp_gb)


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
        c_dp_gb=spec.c_dp_gb or real.c_dp_gb,
        c_pp_gb=spec.c_pp_gb or real.c_pp_gb,
    )


def step_traffic(
    spec: RunSpec, stages: int, replicas: int, layers: Sequence[int] | None = None
) -> StepTraffic:
    """What one step of the run moves, for the step-time model (schedule/step_time.py)."""
    value_bytes = BYTES_PER_VALUE.get(spec.compression, 4)
    rows = -(-spec.batch_size // replicas)  # the largest replica's rows
    micro_rows = -(-rows // min(spec.micro_batches, rows))  # ... and its largest micro-batch
    return StepTraffic(
        stage_gradient_bytes=tuple(
            float(c * value_bytes) for c in stage_parameter_counts(spec, stages, layers)
        ),
        activation_bytes=float(micro_rows * spec.block_size * spec.n_embd * value_bytes),
        micro_batches=min(spec.micro_batches, rows),
    )
