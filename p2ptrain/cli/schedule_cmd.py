"""``p2ptrain schedule``: plan a topology, or evaluate given data-parallel groups."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from p2ptrain.errors import UserError
from p2ptrain.schedule import ALGORITHMS, Schedule, evaluate_groups, load_topology, plan_swarm
from p2ptrain.schedule.topology import Topology

MAX_GROUPS_FILE_BYTES = 16 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology", required=True, metavar="FILE", help="p2ptrain.topology/1 JSON file"
    )
    parser.add_argument(
        "--stages", type=int, help="pipeline stages (default: the topology's workload)"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        help="data-parallel replicas (default: workload, or peers // stages)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="hybrid",
        help="search algorithm (default hybrid)",
    )
    parser.add_argument(
        "--time-budget", type=float, metavar="SECONDS", help="stop the search after this long"
    )
    parser.add_argument(
        "--max-evaluations",
        type=int,
        metavar="N",
        help="stop the search after N cost evaluations (the same plan on any machine load)",
    )
    parser.add_argument(
        "--evaluate",
        metavar="GROUPS.json",
        help="cost of these data-parallel groups instead of searching",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    for flag in ("stages", "replicas"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UserError(f"--{flag} must be >= 1, got {value}")
    if args.time_budget is not None and not args.time_budget > 0:
        raise UserError(f"--time-budget must be > 0, got {args.time_budget}")
    if args.max_evaluations is not None and args.max_evaluations < 1:
        raise UserError(f"--max-evaluations must be >= 1, got {args.max_evaluations}")
    if args.evaluate:
        plan = evaluate_groups(topology, _read_groups(Path(args.evaluate)), stages=args.stages)
    else:
        plan = plan_swarm(
            topology,
            stages=args.stages,
            replicas=args.replicas,
            seed=args.seed,
            algorithm=args.algorithm,
            time_budget_s=args.time_budget,
            max_evaluations=args.max_evaluations,
        )
    if args.json:
        print(json.dumps(plan.to_json()))
    else:
        print(render_plan(topology, plan))
    return 0


def _read_groups(path: Path) -> object:
    try:
        if path.stat().st_size > MAX_GROUPS_FILE_BYTES:
            raise UserError(f"{path}: larger than {MAX_GROUPS_FILE_BYTES} bytes")
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except UserError:
        raise
    except (ValueError, RecursionError) as exc:  # not UTF-8 JSON, or nested past the stack
        raise UserError(f"{path}: not valid JSON ({str(exc)[:80]})") from None


def render_plan(topology: Topology, plan: Schedule) -> str:
    """A readable plan: one line per pipeline (region/peer per stage), then the cost breakdown."""
    labels = [
        [
            f"{topology.region_of(p)}/{topology.peers[p]}"
            if topology.regions
            else topology.peers[p]
            for p in row
        ]
        for row in plan.pipelines
    ]
    width = max(len(label) for row in labels for label in row)
    lines = [
        f"topology {topology.name}: {topology.num_peers} peers, "
        f"{plan.stages} stages x {plan.replicas} replicas, algorithm {plan.algorithm} (seed {plan.seed})",
        "        " + "  ".join(f"stage {j}".ljust(width) for j in range(plan.stages)),
    ]
    for i, row in enumerate(labels):
        lines.append(f"pipe {i:<3d}" + "  ".join(label.ljust(width) for label in row))
    if plan.spares:
        lines.append("spares: " + ", ".join(topology.peers[p] for p in plan.spares))
    lines.append(
        f"cost {plan.cost_s:.4f} s/iteration = data-parallel {plan.dp_cost_s:.4f} s "
        f"+ pipeline (x2) {plan.pp_cost_s:.4f} s"
    )
    lines.append(f"{plan.evaluations} evaluations in {plan.wall_s:.2f} s ({plan.stopped})")
    return "\n".join(lines)
