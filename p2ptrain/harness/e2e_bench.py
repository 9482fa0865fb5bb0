"""`p2ptrain bench e2e`: the same model, data and emulated network, trained with different
placements; tokens/s, time to a target loss, and predicted vs measured communication per step.

Runs, all on one testbed (the same emulated links), every p2ptrain run through the shipped path
(a bootstrap and `join` nodes in the testbed's namespaces, the live planner: e2e_join.py):
- scheduled: the run spec as given (placement = "scheduled", compute-aware);
- compute_blind (with slow peers): the same with compute_aware = false;
- random: placement = "random", placement_seed = seed .. seed + random_seeds - 1 (mean);
- hivemind_dp: data-parallel training with hivemind.Optimizer, every peer holding the whole
  model (p2ptrain/harness/dp_trainer.py), same data and global batch;
- ideal: the scheduled run with every link at 1 Gbit/s and no delay, to measure compute
  (+ pipeline bubbles) per step; measured communication = step time - ideal step time.
Predicted communication: the step-time model (schedule/step_time.py) on the published plan.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from p2ptrain.harness.dp_swarm import DataParallelSwarm
from p2ptrain.harness.e2e_join import mean_step_s, train_join
from p2ptrain.records.run import RunSpec
from p2ptrain.testbed.links import LinkSpec
from p2ptrain.testbed.testbed import Testbed

IDEAL_LINK = LinkSpec(delay_ms=0.0, rate_mbps=1000.0)
HELLO_TIMEOUT_S = 300.0
# ideal last: it speeds the links up
RUN_ORDER = ("scheduled", "compute_blind", "random", "hivemind_dp", "ideal")
JOIN_PATH_RUNS = ("scheduled", "compute_blind", "random")


def slow_peer_indices(num_peers: int, count: int) -> list[int]:
    """Which peers a --slow-peers run slows: evenly spread, from the last peer down (peer 0's
    namespace also holds the bootstrap)."""
    if not 0 <= count <= num_peers:
        raise ValueError(f"{count} slow peers of {num_peers}")
    return sorted({num_peers - 1 - (i * num_peers) // count for i in range(count)})


WORKERS_SHARE = 0.75  # of the machine's cores, split among the workers; the rest: links, nodes


def worker_shares(num_peers: int, cores: int | None = None, share: float = WORKERS_SHARE) -> float:
    """Each worker's equal part of `share` of this machine, in cores."""
    return share * (cores or os.cpu_count() or 1) / num_peers


def worker_quotas(
    num_peers: int, share: float, slow_count: int = 0, slowdown: float = 1.0
) -> dict[int, float]:
    """Compute quotas (peer index -> cores of its training worker): every worker gets `share`
    and the --slow-peers ones 1/slowdown of it; {} for share 0 (workers unlimited).

    Several peers on one machine emulate separate machines only if one peer's speed does not
    depend on how many others compute: eight unlimited workers on two cores timed their stage
    1-7x apart though equal, a quarter-core peer timed no slower than the rest, and a plan of
    four trainers ran on twice the CPU each that the planner had measured. Only the workers: a
    whole peer at 1/16 of a core could not answer probes or gossip in time (a slow GPU is not a
    slow network), and the link forwarder keeps a quarter of the machine."""
    if share <= 0:
        return {}
    slow = set(slow_peer_indices(num_peers, slow_count))
    return {i: share / slowdown if i in slow else share for i in range(num_peers)}


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
    cpu_cores: dict[int, float] | None = None,
    compute_cores: dict[int, float] | None = None,
) -> dict[str, Any]:
    """Run the variants one after the other on one testbed; the result dict of the bench.
    The random placement is run with seeds seed .. seed + random_seeds - 1 and reported as the
    mean over them (each one is kept under "runs"). cpu_cores: peer index -> CPU quota in
    cores of all its processes; compute_cores: of its training worker only (slow peers,
    testbed/cpu.py); both for every run."""
    results: dict[str, Any] = {}
    with Testbed.from_topology(
        topology,
        bandwidth_scale=bandwidth_scale,
        delay_scale=delay_scale,
        cpu_cores=cpu_cores,
        compute_cores=compute_cores,
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
                            **guarded(
                                f"random seed {s}",
                                partial(train_join, bed, spec, "random", s, progress, log_dir),
                                progress,
                            ),
                        }
                        for s in range(seed, seed + random_seeds)
                    ]
                )
            elif name == "hivemind_dp":
                results[name] = guarded(
                    name, lambda: train_dp(bed, spec, progress, log_dir), progress
                )
            else:
                results[name] = guarded(
                    name, partial(train_join, bed, spec, name, seed, progress, log_dir), progress
                )
    if compute_cores or cpu_cores:
        quotas = {**(cpu_cores or {}), **(compute_cores or {})}
        results["slow_peers"] = {str(i): c for i, c in sorted(quotas.items())}
    return summarize(results, target_loss)


def guarded(
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
        for key in (
            "tokens_per_s",
            "step_s",
            "predicted_s",
            "predicted_step_s",
            "predicted_paper_s",
        )
        if all(isinstance(r.get(key), int | float) for r in done)
    }
    result.update(
        path=median.get("path"),
        term=median.get("term"),  # the median run's plan (each run's is under "runs")
        epoch=median.get("epoch"),
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
        for name in JOIN_PATH_RUNS:
            r = results.get(name, {})
            for run in [r, *r.get("runs", [])]:
                if "step_s" in run:
                    run["measured_s"] = run["step_s"] - ideal_step_s
                    run["prediction_error"] = (
                        run["predicted_s"] / run["measured_s"] - 1
                        if run["measured_s"] > 0
                        else None
                    )
                    # the communication model added to the ideal run's step (whose shape and
                    # contention may differ: kept for comparison)
                    run["predicted_step_additive_s"] = ideal_step_s + run["predicted_s"]
                    if run.get("predicted_step_s") is None:
                        run["predicted_step_s"] = run["predicted_step_additive_s"]
    for name in (*JOIN_PATH_RUNS, "ideal"):  # the ideal run is simulated like any other
        r = results.get(name, {})
        for run in [r, *r.get("runs", [])]:
            measured = run.get("worker_step_s") or run.get("step_s")
            if run.get("predicted_step_s") and measured:
                run["step_prediction_error"] = run["predicted_step_s"] / measured - 1
    curves = [r["curve"] for r in results.values() if isinstance(r, dict) and "curve" in r]
    if not curves:
        raise RuntimeError(next(r["error"] for r in results.values() if "error" in r))
    if target_loss is None:  # the loss every run reached: the worst final loss
        target_loss = max(c[-1][1] for c in curves)
    for r in [r for r in results.values() if isinstance(r, dict)]:
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
    if "compute_blind" in results:
        mine = results.get("scheduled", {}).get("tokens_per_s")
        theirs = results["compute_blind"].get("tokens_per_s")
        results["speedup_compute_aware_vs_blind"] = mine / theirs if mine and theirs else None
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
                    f"hivemind_dp: step {step + 1}/{spec.optim.steps} loss {loss:.3f} at {steps[-1][0]:.1f} s"
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
    tokens_per_step = spec.optim.batch_size * spec.model.block_size
    return {
        "tokens_per_s": (len(finished) - 1) * tokens_per_step / (finished[-1] - finished[0])
        if len(finished) > 1 and finished[-1] > finished[0]
        else 0.0,
        "step_s": mean_step_s([t for t, _ in steps]),
        "curve": steps,
    }


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
        f"{'run':<16} {'tokens/s':>9} {'s/step':>7} {'workers':>7} {'pred s/step':>11} "
        f"{'comm pred s':>11} {'comm meas s':>11} "
        f"{'pred err':>8} {'step err':>8} {'paper s':>8} "
        f"{'to loss ' + format(result['target_loss'], '.3f'):>16}"
    ]

    def row(name: str, r: dict[str, Any]) -> None:
        if "error" in r:
            lines.append(f"{name:<16} failed: {r['error']}")
            return
        ttt = r.get("time_to_target_s")
        error = r.get("prediction_error")
        step_error = r.get("step_prediction_error")
        lines.append(
            f"{name:<16} {r['tokens_per_s']:>9.0f} {r['step_s']:>7.2f} "
            f"{r.get('worker_step_s') or nan:>7.2f} {r.get('predicted_step_s') or nan:>11.3f} "
            f"{r.get('predicted_s', nan) if name != 'ideal' else nan:>11.3f} "
            f"{r.get('measured_s', nan):>11.3f} "
            f"{(format(error, '+.0%') if error is not None else '-'):>8} "
            f"{(format(step_error, '+.0%') if step_error is not None else '-'):>8} "
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
    if result.get("speedup_compute_aware_vs_blind"):
        lines.append(
            f"compute-aware / compute-blind tokens/s: {result['speedup_compute_aware_vs_blind']:.2f}x"
            f" (peer: cores {result.get('slow_peers')})"
        )
    return "\n".join(lines)
