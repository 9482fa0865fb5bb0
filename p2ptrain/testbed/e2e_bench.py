"""`p2ptrain bench e2e`: the same model, data and emulated network, trained with different
placements; tokens/s, time to a target loss, and predicted vs measured communication per step.

Runs, all on one testbed (the same emulated links):
- scheduled: p2ptrain with the scheduler's plan on the emulated links;
- random: p2ptrain with a random placement of the same stages x replicas;
- ideal: the scheduled plan with every link at 1 Gbit/s and no delay, to measure compute
  (+ pipeline bubbles) per step; measured communication = step time - ideal step time.
The hivemind.Optimizer data-parallel baseline needs a worker-side trainer (only p2ptrain/worker
may import hivemind) and is reported as not run.
"""

from __future__ import annotations

import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2ptrain.runspec import RunSpec
from p2ptrain.testbed.links import LinkSpec
from p2ptrain.testbed.swarm import EmulatedSwarm, plan_on_testbed
from p2ptrain.testbed.testbed import Testbed

IDEAL_LINK = LinkSpec(delay_ms=0.0, rate_mbps=1000.0)
HELLO_TIMEOUT_S = 300.0


def train_once(
    bed: Testbed, spec: RunSpec, placement: str, seed: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """One training run of the workers in the testbed; per-step losses and finish times."""
    workdir = Path(tempfile.mkdtemp(prefix=f"p2ptrain-e2e-{placement}-"))
    spec = spec.replace(checkpoint_dir=str(workdir / "checkpoints"))
    steps: list[tuple[float, float]] = []  # (seconds since the first step finished, loss)
    try:
        with EmulatedSwarm(spec, bed, workdir) as swarm:
            hellos = swarm.wait_hellos(HELLO_TIMEOUT_S)
            plan, pipelines = plan_on_testbed(
                bed, spec, hellos, "scheduled" if placement == "ideal" else placement, seed
            )
            progress(
                f"{placement}: pipelines {pipelines}, predicted comm {plan['cost_s']:.3f} s/step"
            )
            swarm.send_plan(plan)
            started_s = time.monotonic()

            def on_step(step: int, loss: float, tokens_per_s: float) -> None:
                steps.append((time.monotonic() - started_s, loss))
                progress(
                    f"{placement}: step {step + 1}/{spec.steps} loss {loss:.3f} at {steps[-1][0]:.1f} s"
                )

            result = swarm.train(on_step)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    times = [t for t, _ in steps]
    step_s = (
        statistics.median(b - a for a, b in itertools.pairwise(times))
        if len(times) > 2
        else float("nan")
    )
    return {
        "tokens_per_s": result.tokens_per_s,
        "step_s": step_s,
        "predicted_s": plan["cost_s"],
        "pipelines": pipelines,
        "averaging": result.averaging,  # outcome -> count, over all workers and steps
        "curve": steps,
    }


def run_e2e_bench(
    topology: Any,
    spec: RunSpec,
    *,
    bandwidth_scale: float | None,
    delay_scale: float,
    seed: int,
    target_loss: float | None,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Run the placements one after the other on one testbed; the result dict of the bench."""
    results: dict[str, Any] = {}
    with Testbed.from_topology(
        topology, bandwidth_scale=bandwidth_scale, delay_scale=delay_scale
    ) as bed:
        for placement in ("scheduled", "random", "ideal"):
            if placement == "ideal":
                for a, b in bed.configured:
                    bed.set_link_spec(a, b, IDEAL_LINK)
            try:
                results[placement] = train_once(bed, spec, placement, seed, progress)
            except (RuntimeError, TimeoutError) as exc:  # keep the other runs' results
                results[placement] = {"error": failure_summary(exc), "tokens_per_s": None}
                progress(f"{placement}: failed: {results[placement]['error']}")
    runs = [results[k] for k in ("scheduled", "random", "ideal") if "curve" in results[k]]
    if not runs:
        raise RuntimeError(results["scheduled"]["error"])
    ideal_step_s = results["ideal"].get("step_s")
    for placement in ("scheduled", "random"):
        r = results[placement]
        if "curve" in r and ideal_step_s is not None:
            r["measured_s"] = r["step_s"] - ideal_step_s
    if target_loss is None:  # the loss every run reached: the worst final loss
        target_loss = max(r["curve"][-1][1] for r in runs)
    for r in runs:
        r["time_to_target_s"] = next((t for t, loss in r["curve"] if loss <= target_loss), None)
    results["hivemind_dp"] = {
        "tokens_per_s": None,
        "skipped": "needs a hivemind.Optimizer trainer in p2ptrain/worker (the only layer allowed to import hivemind)",
    }
    results["target_loss"] = target_loss
    results["speedup_scheduled_vs_random"] = (
        results["scheduled"]["tokens_per_s"] / results["random"]["tokens_per_s"]
        if results["random"]["tokens_per_s"] and results["scheduled"]["tokens_per_s"]
        else None
    )
    return results


def failure_summary(exc: BaseException) -> str:
    """The first line of a swarm failure (which worker, exit code) and its last (the cause)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')} ... {lines[-1].strip()}"


def render(result: dict[str, Any]) -> str:
    """A text table of the result."""
    lines = [
        f"{'run':<12} {'tokens/s':>9} {'s/step':>7} {'comm pred s':>11} {'comm meas s':>11} "
        f"{'to loss ' + format(result['target_loss'], '.3f'):>16}"
    ]
    for name in ("scheduled", "random", "ideal"):
        r = result[name]
        if "error" in r:
            lines.append(f"{name:<12} failed: {r['error']}")
            continue
        ttt = r.get("time_to_target_s")
        lines.append(
            f"{name:<12} {r['tokens_per_s']:>9.0f} {r['step_s']:>7.2f} "
            f"{r['predicted_s'] if name != 'ideal' else float('nan'):>11.3f} "
            f"{r.get('measured_s', float('nan')):>11.3f} "
            f"{(format(ttt, '.1f') + ' s') if ttt is not None else '-':>16}"
        )
    lines.append(f"{'hivemind_dp':<12} not run: {result['hivemind_dp']['skipped']}")
    speedup = result["speedup_scheduled_vs_random"]
    if speedup:
        lines.append(f"\nscheduled / random tokens/s: {speedup:.2f}x")
    return "\n".join(lines)
