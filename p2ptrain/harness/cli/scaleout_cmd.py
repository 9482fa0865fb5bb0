"""`p2ptrain bench scaleout`: its arguments and runner (harness/scaleout_bench.py). Importing
this module is cheap (stdlib only); the runner imports what it needs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from p2ptrain.harness.cli.bench_kind import (
    add_output_arguments,
    add_run_arguments,
    progress,
    write_result,
)
from p2ptrain.harness.cli.wan_bench import add_emulation_arguments, emulated_links
from p2ptrain.harness.scaleout_runs import INNER_STEPS, RUN_ORDER

RUNS = RUN_ORDER
DEFAULT_RUNS = "step,diloco,diloco_topk"
# of this machine's cores, split among the workers (bench e2e: 0.75): under diloco all 8 peers
# train at once, and 0.75 left the 9 control processes and the link forwarder less than they
# use, so the workers got less than their quota (run 5: the step model 44% under their steps)
SCALEOUT_WORKERS_SHARE = 0.5


HELP = (
    "train on the emulated WAN (root): every-step averaging vs DiLoCo, tokens/s, time to step's "
    "final loss, data-parallel bytes"
)


def add_arguments(scale: argparse.ArgumentParser) -> None:
    add_emulation_arguments(scale, default_peers=8)
    add_run_arguments(scale, steps=80)
    scale.add_argument(
        "--inner-steps",
        type=int,
        default=INNER_STEPS,
        help=f"DiLoCo's H of the diloco runs (default {INNER_STEPS})",
    )
    scale.add_argument(
        "--runs",
        default=DEFAULT_RUNS,
        help=f"comma-separated, of {', '.join(RUNS)} and diloco_hN (diloco with H = N); "
        "default %(default)s",
    )
    scale.add_argument(
        "--worker-cores",
        type=float,
        metavar="CORES",
        help="each training worker's CPU quota (default: half of this machine's cores split "
        "equally among the peers; 0: no quota)",
    )
    scale.add_argument("--logs", metavar="DIR", help="keep every worker's log under DIR")
    add_output_arguments(
        scale,
        "bench-results",
        "print the JSON last, no table",
        "where scaleout.json and scaleout.png (loss vs seconds and tokens) go",
        metavar="DIR",
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.errors import UserError
    from p2ptrain.harness.cli.wan_bench import load_emulated_topology
    from p2ptrain.harness.e2e_bench import failure_summary, worker_quotas, worker_shares
    from p2ptrain.harness.e2e_plot import write_scaleout_plot
    from p2ptrain.harness.scaleout_bench import render, run_scaleout_bench, run_specs
    from p2ptrain.records.run import load_run_spec
    from p2ptrain.testbed.netns import require_root

    require_root()
    if args.steps < 3 or args.inner_steps < 1:
        raise UserError("--steps must be at least 3 and --inner-steps at least 1")
    runs = tuple(r.strip() for r in args.runs.split(",") if r.strip())
    spec = load_run_spec(args.run).replace(steps=args.steps, stages=args.stages)
    try:
        specs = run_specs(spec, runs, args.inner_steps)
    except ValueError as exc:
        raise UserError(f"--runs: {exc}") from None
    if not specs:
        raise UserError("--runs names no run")
    topology = load_emulated_topology(args)
    share = (
        worker_shares(topology.num_peers, share=SCALEOUT_WORKERS_SHARE)
        if args.worker_cores is None
        else args.worker_cores
    )
    if share < 0:
        raise UserError("--worker-cores must be >= 0")
    try:
        result = run_scaleout_bench(
            topology,
            specs,
            **emulated_links(args),
            seed=args.seed,
            progress=progress,
            log_dir=Path(args.logs) if args.logs else None,
            compute_cores=worker_quotas(topology.num_peers, share),
        )
    except (RuntimeError, TimeoutError) as exc:
        raise UserError(f"the emulated swarm failed ({failure_summary(exc)})") from exc
    out = write_result(Path(args.out) / "scaleout.json", result).parent
    curves = {
        name: (r.get("seconds", []), r.get("tokens", []), r["loss"])
        for name, r in result["runs"].items()
    }
    write_scaleout_plot(
        out / "scaleout.png", curves, title=f"bench scaleout: {topology.num_peers} peers"
    )
    if args.json:
        print(json.dumps(result))
    else:
        print(render(result, topology.num_peers) + f"\n\nwrote {out}/scaleout.json and .png")
    return 0
