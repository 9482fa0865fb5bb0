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


def _progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
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
