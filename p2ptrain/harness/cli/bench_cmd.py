"""``p2ptrain bench KIND``: benchmarks that print a table and write JSON."""

from __future__ import annotations

import argparse
from typing import Any

# each kind's arguments and runner (stdlib only to import: the runners import what they need)
from p2ptrain.harness.cli import control_bench_cmd, scaleout_cmd, wan_bench
from p2ptrain.harness.cli.bench_kind import (
    Kind,
    add_output_arguments,
    comma_integers,
    progress,
    write_result,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    for name, kind in KINDS.items():
        kind.add_arguments(kinds.add_parser(name, help=kind.help))


def run(args: argparse.Namespace) -> int:
    return KINDS[args.kind].run(args)


def _add_scheduler_arguments(sched: argparse.ArgumentParser) -> None:
    add_output_arguments(
        sched, "bench-results/scheduler.json", "print one JSON object instead of the table"
    )
    sched.add_argument(
        "--paper", action="store_true", help="also run the paper's GCMA (about 15 s a scenario)"
    )
    sched.add_argument(
        "--scaling",
        default="64,128,256,512,1024",
        help="comma-separated swarm sizes of the scaling series ('' for none)",
    )
    sched.add_argument(
        "--time-budget", type=float, default=3.0, help="per-run budget on the scenarios (s)"
    )


def _add_convergence_arguments(conv: argparse.ArgumentParser) -> None:
    conv.add_argument("--replicas", type=int, default=4, help="data-parallel replicas")
    conv.add_argument("--steps", type=int, default=300, help="steps per variant")
    conv.add_argument("--batch", type=int, default=8, help="sequences per replica per step")
    conv.add_argument(
        "--inner-steps",
        default="30,10",
        help="comma-separated H values of diloco (first: the one the compressed variants use)",
    )
    conv.add_argument("--variants", default="", help="comma-separated subset of the variants")
    conv.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")
    conv.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train every variant once per seed (the run's seed and the next ones) and report "
        "the means (default 1)",
    )
    conv.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    add_output_arguments(conv, "bench-results/convergence.json")


def _run_scheduler(args: argparse.Namespace) -> int:
    import json

    from p2ptrain.errors import UserError
    from p2ptrain.harness.scheduler_bench import SCALING_SERIES, render, run_benchmark

    sizes = comma_integers(args.scaling, "--scaling")
    known = {n for n, _, _ in SCALING_SERIES}
    if set(sizes) - known:
        raise UserError(f"--scaling sizes must be among {sorted(known)}")
    result: dict[str, Any] = run_benchmark(args.paper, sizes, args.time_budget, progress)
    out = write_result(args.out, result)
    print(json.dumps(result) if args.json else render(result))
    if not args.json:
        print(f"\nwrote {out}")
    return 0


def _run_convergence(args: argparse.Namespace) -> int:
    import json

    import torch

    from p2ptrain.errors import UserError
    from p2ptrain.harness.convergence_bench import run_benchmark
    from p2ptrain.harness.convergence_bench_report import render
    from p2ptrain.records.run import load_run_spec

    inner = tuple(comma_integers(args.inner_steps, "--inner-steps"))
    numbers = (args.replicas, args.steps, args.batch, args.seeds)
    if not inner or min(inner) < 1 or min(numbers) < 1:
        raise UserError("--inner-steps, --replicas, --steps, --batch and --seeds must be >= 1")
    torch.set_num_threads(max(1, args.threads))
    only = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    result = run_benchmark(
        args.replicas,
        args.steps,
        args.batch,
        inner,
        only,
        load_run_spec(args.run),
        progress,
        seeds=args.seeds,
    )
    out = write_result(args.out, result)
    print(render(result))
    print(json.dumps(result) if args.json else f"\nwrote {out}")
    return 0


KINDS = {
    "scheduler": Kind(
        "the scheduler on the paper's scenarios and a scaling series",
        _add_scheduler_arguments,
        _run_scheduler,
    ),
    **wan_bench.KINDS,
    "convergence": Kind(
        "one process, no network: every-step vs DiLoCo (two H, int8, top-k) vs int8 "
        "activations, final loss at equal tokens",
        _add_convergence_arguments,
        _run_convergence,
    ),
    "control": Kind(control_bench_cmd.HELP, control_bench_cmd.add_arguments, control_bench_cmd.run),
    "scaleout": Kind(scaleout_cmd.HELP, scaleout_cmd.add_arguments, scaleout_cmd.run),
}
