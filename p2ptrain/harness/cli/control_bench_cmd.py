"""``p2ptrain bench control``: the control plane's logic at scale, simulated (harness/control_bench.py)."""

from __future__ import annotations

import argparse
import json
import sys

from p2ptrain.harness.cli.bench_kind import add_output_arguments, comma_integers, write_result

HELP = (
    "the control plane (coordinates, estimates, election, planning) at 100-1,000 simulated "
    "peers: traffic per node, time to the first plan, estimate errors, failover"
)


def add_arguments(control: argparse.ArgumentParser) -> None:
    control.add_argument("--peers", default="100,300,1000", help="comma-separated swarm sizes")
    control.add_argument("--seed", type=int, default=0)
    control.add_argument("--horizon", type=float, default=240.0, help="simulated seconds at most")
    add_output_arguments(control, "bench-results/control.json")


def run(args: argparse.Namespace) -> int:
    from p2ptrain.errors import UserError
    from p2ptrain.harness.control_bench import run_benchmark
    from p2ptrain.harness.control_bench_report import render

    sizes = comma_integers(args.peers, "--peers")
    if not sizes or min(sizes) < 16:
        raise UserError("--peers needs swarm sizes of at least 16")
    result = run_benchmark(sizes, args.seed, args.horizon)
    out = write_result(args.out, result)
    if not args.json:
        print(render(result))
        print(f"wrote {out}", file=sys.stderr)
    print(json.dumps(result))
    return 0
