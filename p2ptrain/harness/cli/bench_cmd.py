"""``p2ptrain bench KIND``: benchmarks that print a table and write JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    sched = kinds.add_parser(
        "scheduler", help="the scheduler on the paper's scenarios and a scaling series"
    )
    sched.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the table"
    )
    sched.add_argument(
        "--out", default="bench-results/scheduler.json", help="where to write the JSON"
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
    from p2ptrain.harness.cli.wan_bench import add_kinds  # stdlib only: cheap

    add_kinds(kinds)
    _add_convergence_kind(kinds)
    from p2ptrain.harness.cli.control_bench_cmd import add_kind as add_control_kind

    add_control_kind(kinds)
    from p2ptrain.harness.cli.scaleout_cmd import add_kind as add_scaleout_kind

    add_scaleout_kind(kinds)


def _add_convergence_kind(kinds: Any) -> None:
    conv = kinds.add_parser(
        "convergence",
        help="one process, no network: every-step vs DiLoCo (two H, int8, top-k) vs int8 "
        "activations, final loss at equal tokens",
    )
    conv.add_argument("--json", action="store_true", help="print one JSON object, no table")
    conv.add_argument("--replicas", type=int, default=4, help="data-parallel replicas")
    conv.add_argument("--steps", type=int, default=300, help="steps per variant")
    conv.add_argument("--batch", type=int, default=8, help="sequences per replica per step")
    conv.add_argument(
        "--inner-steps",
        default="10,30",
        help="comma-separated H values of diloco (first: the one the compressed variants use)",
    )
    conv.add_argument("--variants", default="", help="comma-separated subset of the variants")
    conv.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")
    conv.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    conv.add_argument(
        "--out", default="bench-results/convergence.json", help="where to write the JSON"
    )


def _progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.kind == "convergence":
        return _run_convergence(args)
    if args.kind == "scaleout":
        from p2ptrain.harness.cli.scaleout_cmd import run as run_scaleout

        return run_scaleout(args)
    if args.kind == "control":
        from p2ptrain.harness.cli.control_bench_cmd import run as run_control

        return run_control(args)
    if args.kind != "scheduler":
        from p2ptrain.harness.cli.wan_bench import run_kind

        return run_kind(args)
    from p2ptrain.errors import UserError
    from p2ptrain.harness.scheduler_bench import SCALING_SERIES, render, run_benchmark

    try:
        sizes = [int(s) for s in args.scaling.split(",") if s.strip()]
    except ValueError:
        raise UserError(
            f"--scaling must be comma-separated integers, got {args.scaling!r}"
        ) from None
    known = {n for n, _, _ in SCALING_SERIES}
    if set(sizes) - known:
        raise UserError(f"--scaling sizes must be among {sorted(known)}")
    result: dict[str, Any] = run_benchmark(args.paper, sizes, args.time_budget, _progress)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result) if args.json else render(result))
    if not args.json:
        print(f"\nwrote {out}")
    return 0


def _run_convergence(args: argparse.Namespace) -> int:
    import torch

    from p2ptrain.errors import UserError
    from p2ptrain.harness.convergence_bench import render, run_benchmark
    from p2ptrain.records.run import load_run_spec

    try:
        inner = tuple(int(h) for h in args.inner_steps.split(",") if h.strip())
    except ValueError:
        raise UserError(f"--inner-steps must be integers, got {args.inner_steps!r}") from None
    if not inner or min(inner) < 1 or args.replicas < 1 or args.steps < 1 or args.batch < 1:
        raise UserError("--inner-steps, --replicas, --steps and --batch must be >= 1")
    torch.set_num_threads(max(1, args.threads))
    only = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    result = run_benchmark(
        args.replicas, args.steps, args.batch, inner, only, load_run_spec(args.run), _progress
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(render(result))
    print(json.dumps(result) if args.json else f"\nwrote {out}")
    return 0
