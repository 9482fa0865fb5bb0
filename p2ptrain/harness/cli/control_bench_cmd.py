"""``p2ptrain bench control``: the control plane's logic at scale, simulated (harness/control_bench.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_kind(kinds: Any) -> None:
    control = kinds.add_parser(
        "control",
        help="the control plane (coordinates, estimates, election, planning) at 100-1,000 "
        "simulated peers: traffic per node, time to the first plan, estimate errors, failover",
    )
    control.add_argument("--peers", default="100,300,1000", help="comma-separated swarm sizes")
    control.add_argument("--seed", type=int, default=0)
    control.add_argument("--horizon", type=float, default=240.0, help="simulated seconds at most")
    control.add_argument("--json", action="store_true", help="print one JSON object, no table")
    control.add_argument(
        "--out", default="bench-results/control.json", help="where to write the JSON"
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.errors import UserError
    from p2ptrain.harness.control_bench import render, run_benchmark

    try:
        sizes = [int(s) for s in args.peers.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--peers must be comma-separated integers, got {args.peers!r}") from None
    if not sizes or min(sizes) < 16:
        raise UserError("--peers needs swarm sizes of at least 16")
    result = run_benchmark(sizes, args.seed, args.horizon)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if not args.json:
        print(render(result))
        print(f"wrote {out}", file=sys.stderr)
    print(json.dumps(result))
    return 0
