"""`p2ptrain bench e2e`: the same model, data and emulated network, trained with different
placements; tokens/s, time to a target loss, and predicted vs measured communication per step.

Runs, all on one testbed (the same emulated links):
- scheduled: p2ptrain with the scheduler's plan on the emulated links;
- random: p2ptrain with random placements of the same stages x replicas (a few seeds, mean);
- hivemind_dp: data-parallel training with hivemind.Optimizer, every peer holding the whole
  model (p2ptrain/harness/dp_trainer.py), same data and global batch;
- ideal: the scheduled plan with every link at 1 Gbit/s and no delay, to measure compute
  (+ pipeline bubbles) per step; measured communication = step time - ideal step time.
Predicted communication: the step-time model (schedule/step_time.py), and the paper's cost.
"""

from __future__ import annotations

import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from p2ptrain.harness.dp_swarm import DataParallelSwarm
from p2ptrain.harness.testbed_swarm import (
    EmulatedSwarm,
    plan_on_testbed,
    predicted_step,
)
from p2ptrain.records.run import RunSpec
from p2ptrain.testbed.links import LinkSpec
from p2ptrain.testbed.testbed import Testbed

IDEAL_LINK = LinkSpec(delay_ms=0.0, rate_mbps=1000.0)
HELLO_TIMEOUT_S = 300.0


def train_once(
    bed: Testbed,
    spec: RunSpec,
    placement: str,
    seed: int,
    progress: Callable[[str], None],
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """One training run of the workers in the testbed; per-step losses and finish times.
    With log_dir, the workers' logs are copied to log_dir/<placement>/ before cleanup."""
    workdir = Path(tempfile.mkdtemp(prefix=f"p2ptrain-e2e-{placement}-"))
    spec = spec.replace(checkpoint_dir=str(workdir / "checkpoints"))
    steps: list[tuple[float, float]] = []  # (seconds since the first step finished, loss)
    try:
        with EmulatedSwarm(spec, bed, workdir) as swarm:
            hellos = swarm.wait_hellos(HELLO_TIMEOUT_S)
            plan, pipelines = plan_on_testbed(
                bed, spec, hellos, "scheduled" if placement == "ideal" else placement, seed
            )
            progress(f"{placement}: pipelines {pipelines} (seed {seed})")
            swarm.send_plan(plan)
            started_s = time.monotonic()

            def on_step(step: int, loss: float, tokens_per_s: float) -> None:
                steps.append((time.monotonic() - started_s, loss))
                progress(
                    f"{placement}: step {step + 1}/{spec.steps} loss {loss:.3f} at {steps[-1][0]:.1f} s"
                )

            result = swarm.train(on_step)
    finally:
        if log_dir is not None:
            keep = log_dir / (f"random-seed{seed}" if placement == "random" else placement)
            keep.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("worker-*.log"):
                shutil.copy(log, keep / log.name)
        shutil.rmtree(workdir, ignore_errors=True)
    model = predicted_step(bed, spec, pipelines)
    return {
        "seed": seed,
        "tokens_per_s": result.tokens_per_s,
        "step_s": _median_step_s([t for t, _ in steps]),
        # the step-time model (schedule/step_time.py) on the emulated WAN links
        "predicted_s": model.comm_s,
        "predicted_pipeline_s": model.pipeline_s,
        "predicted_averaging_s": model.averaging_s,
        "predicted_critical_stage": model.critical_stage,
        "predicted_paper_s": plan.cost_s,  # the paper's DP + 2 x PP (schedule/cost.py)
        "pipelines": pipelines,
        "averaging": result.averaging,  # outcome -> count, over all workers and steps
        "curve": steps,
    }


RUN_ORDER = ("scheduled", "random", "hivemind_dp", "ideal")  # ideal last: it speeds the links up


def run_e2e_bench(
    topology: Any,
    spec: RunSpec,
    *,
    bandwidth_scale: float | None,
    delay_scale: float,
    seed: int,
    target_loss: float | None,
    progress: Callable[[str], None],
    random_seeds: int = 3,
    runs: tuple[str, ...] = RUN_ORDER,
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the placements one after the other on one testbed; the result dict of the bench.
    The random placement is run with seeds seed .. seed + random_seeds - 1 and reported as the
    mean over them (each one is kept under "runs")."""
    results: dict[str, Any] = {}
    with Testbed.from_topology(
        topology, bandwidth_scale=bandwidth_scale, delay_scale=delay_scale
    ) as bed:
        for name in (r for r in RUN_ORDER if r in runs):
            if name == "ideal":
                for a, b in bed.configured:
                    bed.set_link_spec(a, b, IDEAL_LINK)
            if name == "random":
                results[name] = mean_of_runs(
                    [
                        {
                            "seed": s,
                            **_guarded(
                                f"random seed {s}",
                                partial(train_once, bed, spec, "random", s, progress, log_dir),
                                progress,
                            ),
                        }
                        for s in range(seed, seed + random_seeds)
                    ]
                )
            elif name == "hivemind_dp":
                results[name] = _guarded(
                    name, lambda: train_dp(bed, spec, progress, log_dir), progress
                )
            else:
                results[name] = _guarded(
                    name, partial(train_once, bed, spec, name, seed, progress, log_dir), progress
                )
    return summarize(results, target_loss)


def _guarded(
    name: str, run: Callable[[], dict[str, Any]], progress: Callable[[str], None]
) -> dict[str, Any]:
    try:
        return run()
    except (RuntimeError, TimeoutError) as exc:  # keep the other runs' results
        progress(f"{name}: failed: {failure_summary(exc)}")
        return {"error": failure_summary(exc), "tokens_per_s": None}


def mean_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The random placement over several seeds: means of the numbers, the median run's curve."""
    done = [r for r in runs if "curve" in r]
    if not done:
        return {"error": runs[0]["error"], "tokens_per_s": None, "runs": runs}
    by_speed = sorted(done, key=lambda r: r["tokens_per_s"])
    median = by_speed[len(by_speed) // 2]
    result: dict[str, Any] = {
        key: statistics.mean(r[key] for r in done)
        for key in ("tokens_per_s", "step_s", "predicted_s", "predicted_paper_s")
    }
    result.update(
        aggregate=f"mean over {len(done)} random placements (seeds {[r['seed'] for r in done]})",
        curve=median["curve"],
        pipelines=median["pipelines"],
        median_seed=median["seed"],
        runs=runs,
    )
    return result


def summarize(results: dict[str, Any], target_loss: float | None) -> dict[str, Any]:
    """Measured communication (step - ideal step), time to the target loss, the speedups."""
    ideal_step_s = results.get("ideal", {}).get("step_s")
    if ideal_step_s is not None:
        for name in ("scheduled", "random"):
            r = results.get(name, {})
            for run in [r, *r.get("runs", [])]:
                if "step_s" in run:
                    run["measured_s"] = run["step_s"] - ideal_step_s
                    run["prediction_error"] = run["predicted_s"] / run["measured_s"] - 1
    curves = [r["curve"] for r in results.values() if "curve" in r]
    if not curves:
        raise RuntimeError(next(iter(results.values()))["error"])
    if target_loss is None:  # the loss every run reached: the worst final loss
        target_loss = max(c[-1][1] for c in curves)
    for r in results.values():
        for run in [r, *r.get("runs", [])]:
            if "curve" in run:
                run["time_to_target_s"] = next(
                    (t for t, loss in run["curve"] if loss <= target_loss), None
                )
    results["target_loss"] = target_loss
    for other in ("random", "hivemind_dp"):
        mine = results.get("scheduled", {}).get("tokens_per_s")
        theirs = results.get(other, {}).get("tokens_per_s")
        results[f"speedup_scheduled_vs_{other}"] = mine / theirs if mine and theirs else None
    return results


def train_dp(
    bed: Testbed, spec: RunSpec, progress: Callable[[str], None], log_dir: Path | None = None
) -> dict[str, Any]:
    """The hivemind.Optimizer data-parallel baseline: one trainer per peer, whole model each."""
    workdir = Path(tempfile.mkdtemp(prefix="p2ptrain-e2e-dp-"))
    steps: list[tuple[float, float]] = []
    finished: list[float] = []
    try:
        with DataParallelSwarm(spec, bed.num_peers, workdir, bed) as swarm:
            swarm.wait_ready(HELLO_TIMEOUT_S)
            progress(f"hivemind_dp: {bed.num_peers} peers, whole model each")
            started = swarm.start()

            def on_step(step: int, loss: float, at: float) -> None:
                steps.append((at - started, loss))
                finished.append(at)
                progress(
                    f"hivemind_dp: step {step + 1}/{spec.steps} loss {loss:.3f} at {steps[-1][0]:.1f} s"
                )

            swarm.follow(on_step)
            swarm.wait_exit()
    finally:
        if log_dir is not None:
            keep = log_dir / "hivemind_dp"
            keep.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("dp-*.log"):
                shutil.copy(log, keep / log.name)
        shutil.rmtree(workdir, ignore_errors=True)
    tokens_per_step = spec.batch_size * spec.block_size
    return {
        "tokens_per_s": (len(finished) - 1) * tokens_per_step / (finished[-1] - finished[0])
        if len(finished) > 1 and finished[-1] > finished[0]
        else 0.0,
        "step_s": _median_step_s([t for t, _ in steps]),
        "curve": steps,
    }


def _median_step_s(times: list[float]) -> float:
    if len(times) <= 2:
        return float("nan")
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def failure_summary(exc: BaseException) -> str:
    """The first line of a swarm failure (which worker, exit code) and its last (the cause)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')} ... {lines[-1].strip()}"


def render(result: dict[str, Any]) -> str:
    """A text table of the result."""
    nan = float("nan")
    lines = [
        f"{'run':<16} {'tokens/s':>9} {'s/step':>7} {'comm pred s':>11} {'comm meas s':>11} "
        f"{'pred err':>8} {'paper s':>8} {'to loss ' + format(result['target_loss'], '.3f'):>16}"
    ]

    def row(name: str, r: dict[str, Any]) -> None:
        if "error" in r:
            lines.append(f"{name:<16} failed: {r['error']}")
            return
        ttt = r.get("time_to_target_s")
        error = r.get("prediction_error")
        lines.append(
            f"{name:<16} {r['tokens_per_s']:>9.0f} {r['step_s']:>7.2f} "
            f"{r.get('predicted_s', nan) if name != 'ideal' else nan:>11.3f} "
            f"{r.get('measured_s', nan):>11.3f} "
            f"{(format(error, '+.0%') if error is not None else '-'):>8} "
            f"{r.get('predicted_paper_s', nan) if name != 'ideal' else nan:>8.3f} "
            f"{(format(ttt, '.1f') + ' s') if ttt is not None else '-':>16}"
        )

    for name in RUN_ORDER:
        if name not in result:
            continue
        r = result[name]
        row("random (mean)" if name == "random" and "runs" in r else name, r)
        for run in r.get("runs", []):
            row(f"  random seed {run.get('seed', '?')}", run)
    for other in ("random", "hivemind_dp"):
        speedup = result.get(f"speedup_scheduled_vs_{other}")
        if speedup:
            lines.append(f"scheduled / {other} tokens/s: {speedup:.2f}x")
    return "\n".join(lines)
