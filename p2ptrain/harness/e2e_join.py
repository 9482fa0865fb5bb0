"""One p2ptrain run of `bench e2e` through the shipped path: a bootstrap and N `join` nodes in
the testbed's namespaces (as `p2ptrain local --emulate`), which discover, measure the emulated
links, elect a planner and train on its plans. The run spec says how the live planner places
(placement, placement_seed, compute_aware); min_peers = N, so the first plan holds everyone.

Timing starts at the first plan the workers report: discovery, measuring and the election are
not training. Tokens/s counts the steps after the first one finished, the step time is the
median gap between steps. The predictions are on the plan the planner published (its
pipelines, mapped to testbed peers by the nodes' identities) and the emulated links: the
communication model (predicted_s), and the step simulated with the stages' compute as the
workers timed and profiled it in this run (`join --profile`; predicted_step_s;
harness/e2e_compute.py). Under `sync = "diloco"` every replica trains `batch_size` rows of its
own (tokens a step grow with the replicas) and a stage group's exchange serves H steps.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2ptrain import identity
from p2ptrain.harness.e2e_compute import (
    compute_summary,
    measured_compute,
    steady_step_s,
    swarm_step_times,
)
from p2ptrain.harness.e2e_traffic import (
    dp_bytes,
    link_table,
    measured_link_bytes,
    predicted_link_bytes,
)
from p2ptrain.harness.local_run import train_with_control_plane
from p2ptrain.harness.testbed_sites import TestbedSites
from p2ptrain.harness.testbed_swarm import predicted_step, simulated_step
from p2ptrain.records import Plan
from p2ptrain.records.run import RunSpec
from p2ptrain.schedule.wire_bytes import activation_row_bytes
from p2ptrain.schedule.workload import step_traffic, tokens_per_step
from p2ptrain.testbed.testbed import Testbed


def run_spec_for(spec: RunSpec, name: str, seed: int) -> RunSpec:
    """The run spec of one variant: how the live planner is to place."""
    if name == "random":
        return spec.replace(placement="random", placement_seed=seed)
    if name in ("compute_blind", "ideal"):
        # ideal keeps the run's own shape, as random and compute_blind do: its step is the
        # compute and bubbles of that shape (a shape-searching planner may pick another)
        return spec.replace(placement="scheduled", compute_aware=False)
    return spec.replace(placement="scheduled")


def train_join(
    bed: Testbed,
    spec: RunSpec,
    name: str,
    seed: int,
    progress: Callable[[str], None],
    log_dir: Path | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """One run of variant `name` through bootstrap + join; the bench's per-run dict. `label`
    names the run in progress lines and under log_dir (default: `name`)."""
    label = label or name
    workdir = Path(tempfile.mkdtemp(prefix=f"p2ptrain-e2e-{label}-"))
    spec = run_spec_for(spec, name, seed).replace(checkpoint_dir=str(workdir / "checkpoints"))
    planned_s: list[float] = []  # when the workers reported the first plan
    plans: list[Plan] = []  # every plan the workers reported, in order
    steps: list[tuple[float, float]] = []  # (seconds since the first plan, loss)
    steps_under: list[int] = []  # per step: the index in `plans` of the plan it ran under
    started_s = time.monotonic()

    def on_plan(plan: Plan) -> None:
        if not planned_s:
            planned_s.append(time.monotonic())
        plans.append(plan)
        progress(
            f"{label}: plan term {plan.term} epoch {plan.epoch} after "
            f"{time.monotonic() - started_s:.0f} s"
        )

    def on_step(step: int, loss: float, tokens_per_s: float) -> None:
        steps.append((time.monotonic() - planned_s[0], loss))
        steps_under.append(len(plans) - 1)
        progress(
            f"{label}: step {step + 1}/{spec.optim.steps} loss {loss:.3f} at {steps[-1][0]:.1f} s"
        )

    try:
        # --profile: the step simulation takes each stage's CPU from the workers' profiles
        result = train_with_control_plane(
            spec,
            bed.num_peers,
            workdir,
            on_plan,
            on_step,
            TestbedSites(bed),
            own_checkpoints=True,
            profile=True,
        )
        peer_ids = [
            identity.peer_id_of(identity.load_identity(workdir / f"peer-{i}.key"))
            for i in range(bed.num_peers)
        ]
        logs = [workdir / f"metrics-{i}.jsonl" for i in range(bed.num_peers)]
        # a re-plan restarts the sessions: the run is described by the plan that trained most
        main = max(range(len(plans)), key=steps_under.count) if steps_under else -1
        # tokens a step by the plan each step ran under (diloco: R x batch_size rows)
        step_tokens = [
            tokens_per_step(spec, (plans[i] if plans else result.plan).num_replicas)
            for i in steps_under
        ]
        described = describe_run(
            bed,
            spec,
            plans[main] if plans else result.plan,
            peer_ids,
            logs,
            result,
            steps,
            planned_s[0] - started_s,
            step_tokens,
        )
        described["plans"] = [[p.term, p.epoch, steps_under.count(i)] for i, p in enumerate(plans)]
        return described
    finally:
        if log_dir is not None:
            keep = log_dir / (f"random-seed{seed}" if name == "random" else label)
            keep.mkdir(parents=True, exist_ok=True)
            for log in [*workdir.glob("*.log"), *workdir.glob("metrics-*.jsonl")]:
                shutil.copy(log, keep / log.name)
        shutil.rmtree(workdir, ignore_errors=True)


def describe_run(
    bed: Testbed,
    spec: RunSpec,
    plan: Plan,
    peer_ids: list[str],
    logs: list[Path],
    result: Any,
    steps: list[tuple[float, float]],
    plan_after_s: float,
    step_tokens: list[int] | None = None,
) -> dict[str, Any]:
    """The run's numbers: throughput, the plan, predicted step and bytes per link."""
    index = {p: i for i, p in enumerate(peer_ids)}
    pipelines = [[index[p] for p in pipe] for pipe in plan.pipelines]
    layers = plan.stage_layers or None  # a compute-aware plan may split unevenly
    model = predicted_step(bed, spec, pipelines, layers)
    traffic = step_traffic(spec, len(pipelines[0]), len(pipelines), layers)
    predicted = predicted_link_bytes(
        pipelines,
        traffic.stage_gradient_bytes,
        replica_rows(spec, len(pipelines)),
        spec.model.block_size * activation_row_bytes(spec.wire.compression, spec.model.n_embd),
        traffic.inner_steps,
        traffic.sparse_gather,
    )
    measured = measured_link_bytes(logs, peer_ids, plan.key)
    compute = measured_compute(
        logs, plan.key, pipelines, spec.optim.micro_batches, bed.compute_cores
    )
    simulated = None if compute is None else simulated_step(bed, spec, pipelines, layers, compute)
    return {
        "path": "join",
        "seed": spec.swarm.placement_seed,
        "placement": spec.swarm.placement,
        "compute_aware": spec.swarm.compute_aware,
        "term": plan.term,
        "epoch": plan.epoch,
        "planner": plan.planner,
        "first_plan_after_s": round(plan_after_s, 1),
        # the harness counts batch_size rows a step; under diloco each replica trains that many
        "tokens_per_s": result.tokens_per_s
        if step_tokens is None
        else span_tokens_per_s([t for t, _ in steps], step_tokens),
        "step_tokens": step_tokens,
        "step_s": mean_step_s([t for t, _ in steps]),
        # the step-time model (schedule/step_time.py) on the published plan and emulated links
        "predicted_s": model.comm_s,
        "predicted_pipeline_s": model.pipeline_s,
        "predicted_averaging_s": model.averaging_s,
        "predicted_critical_stage": model.critical_stage,
        "predicted_paper_s": plan.cost_s,  # what the live planner priced the plan at
        # the whole step, simulated: links as emulated, stages' compute as timed in this run
        "predicted_step_s": simulated,
        "stage_compute": compute_summary(logs, plan.key, pipelines),
        # the steady-state step as the workers time it: what predicted_step_s is compared with
        "worker_step_s": steady_step_s(logs, plan.key, pipelines),
        "pipelines": pipelines,
        "stage_layers": list(layers) if layers else None,
        "worker_steps_s": swarm_step_times(logs, plan.key, pipelines),
        "averaging": result.averaging,  # outcome -> count, over all workers and steps
        "links": link_table(predicted, measured[0] if measured else None, spec.optim.steps),
        "bytes_sent_per_step": measured[1] if measured else None,
        "predicted_dp_bytes_per_step": dp_bytes(predicted, pipelines),
        "dp_bytes_per_step": dp_bytes(measured[0], pipelines) if measured else None,
        "curve": steps,
    }


def span_tokens_per_s(times: list[float], step_tokens: list[int]) -> float:
    """Tokens of the steps after the first over their span (0 for fewer than two steps)."""
    span_s = times[-1] - times[0] if len(times) > 1 else 0.0
    return sum(step_tokens[1:]) / span_s if span_s > 0 else 0.0


def mean_step_s(times: list[float]) -> float:
    """The mean gap between step finish times, first to last (the span tokens/s counts; NaN
    for fewer than three steps). Not the median gap: finish times are read by polling the
    metrics logs every 0.2 s, and the median of such gaps read a 0.72 s step as 0.80 s."""
    if len(times) <= 2:
        return float("nan")
    return (times[-1] - times[0]) / (len(times) - 1)


def replica_rows(spec: RunSpec, replicas: int) -> list[float]:
    """Rows each replica trains a step: `batch_size` each under diloco, else the global batch
    split as train/data.py's replica_rows splits it."""
    if spec.optim.sync == "diloco":
        return [float(spec.optim.batch_size)] * replicas
    base, extra = divmod(spec.optim.batch_size, replicas)
    return [float(base + (1 if r < extra else 0)) for r in range(replicas)]
