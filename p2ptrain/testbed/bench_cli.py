"""The testbed's kinds of `p2ptrain bench` (netem; e2e): arguments and runners.

Kept here, apart from p2ptrain/cli/bench_cmd.py, which only registers and dispatches them.
Importing this module is cheap (stdlib only); the runners import what they need.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from p2ptrain.testbed.links import DEFAULT_BANDWIDTH_SCALE


def add_emulation_arguments(
    parser: argparse.ArgumentParser, default_peers: int, positional_topology: bool = False
) -> None:
    """Options that choose the emulated topology and how it is scaled."""
    parser.add_argument(
        "topology" if positional_topology else "--topology",
        nargs="?" if positional_topology else None,
        help="a p2ptrain.topology/1 file (default: --peers peers over --cities, "
        "links from data/region_links.json)",
    )
    parser.add_argument(
        "--peers", type=int, default=default_peers, help="peers of the default topology"
    )
    parser.add_argument(
        "--cities",
        default=",".join(_default_cities()),
        help="comma-separated cities of the default topology",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the default topology")
    parser.add_argument(
        "--bandwidth-scale",
        type=float,
        default=DEFAULT_BANDWIDTH_SCALE,
        help="emulated Mbit/s = topology Gbit/s x 1000 x this (default %(default)s)",
    )
    parser.add_argument("--delay-scale", type=float, default=1.0, help="multiply every delay")


def _default_cities() -> list[str]:
    from p2ptrain.testbed.netem_bench import DEFAULT_CITIES

    return DEFAULT_CITIES


def add_kinds(kinds: Any) -> None:
    """Register the netem kind on bench's KIND subparsers."""
    netem = kinds.add_parser(
        "netem", help="emulated links (root): configured vs measured RTT and throughput"
    )
    add_emulation_arguments(netem, default_peers=8)
    netem.add_argument("--json", action="store_true", help="print one JSON object, no table")
    netem.add_argument("--links", type=int, default=6, help="how many links to sample")
    netem.add_argument("--seconds", type=float, default=3.0, help="bulk transfer per link (s)")
    netem.add_argument("--out", default="bench-results/netem.json", help="where to write the JSON")


def load_emulated_topology(args: argparse.Namespace) -> Any:
    """The topology named by --topology, or the default city topology."""
    from p2ptrain.errors import UserError
    from p2ptrain.schedule import load_topology
    from p2ptrain.schedule.synthetic import city_topology

    if args.topology:
        return load_topology(args.topology)
    if args.peers < 2:
        raise UserError("--peers must be at least 2")
    cities = [c.strip() for c in args.cities.split(",") if c.strip()]
    return city_topology(args.peers, 1, args.peers, args.seed, cities)


def run_kind(args: argparse.Namespace) -> int:
    """Run the testbed bench kind named by args.kind."""
    from p2ptrain.errors import UserError
    from p2ptrain.testbed.netem_bench import render, run_netem_bench
    from p2ptrain.testbed.netns import require_root

    require_root()
    if args.links < 1 or args.seconds <= 0:
        raise UserError("--links must be >= 1 and --seconds > 0")
    topology = load_emulated_topology(args)
    result: dict[str, Any] = run_netem_bench(
        topology,
        num_links=args.links,
        bulk_s=args.seconds,
        bandwidth_scale=args.bandwidth_scale,
        delay_scale=args.delay_scale,
        progress=lambda m: print(f"... {m}", file=sys.stderr, flush=True),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result) if args.json else render(result) + f"\n\nwrote {out}")
    return 0 if result["pass"] else 1
