"""The WAN testbed's kinds of `p2ptrain bench` (netem; e2e): arguments and runners; and the
options that choose an emulated topology (`p2ptrain testbed up` takes them too).

bench_cmd.py's table of kinds holds them (KINDS). Importing this module is cheap (stdlib only); the
runners import what they need.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from p2ptrain.harness.cli.bench_kind import (
    Kind,
    add_output_arguments,
    add_run_arguments,
    progress,
    write_result,
)
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
    from p2ptrain.harness.netem_bench import DEFAULT_CITIES

    return DEFAULT_CITIES


def emulated_links(args: argparse.Namespace) -> dict[str, float]:
    """How the emulated links are scaled (add_emulation_arguments), as the runners take it."""
    return {"bandwidth_scale": args.bandwidth_scale, "delay_scale": args.delay_scale}


def _add_netem_arguments(netem: argparse.ArgumentParser) -> None:
    add_emulation_arguments(netem, default_peers=8)
    netem.add_argument("--links", type=int, default=6, help="how many links to sample")
    netem.add_argument("--seconds", type=float, default=3.0, help="bulk transfer per link (s)")
    add_output_arguments(netem, "bench-results/netem.json")


def _add_e2e_arguments(e2e: argparse.ArgumentParser) -> None:
    add_emulation_arguments(e2e, default_peers=8)
    add_run_arguments(e2e, steps=10)
    e2e.add_argument(
        "--random-seeds",
        type=int,
        default=3,
        help="random placements to run (seeds --seed ..), reported as their mean",
    )
    e2e.add_argument(
        "--runs",
        help="which runs, comma-separated, of scheduled, compute_blind, random, hivemind_dp, "
        "ideal (default: all); measured comm needs ideal",
    )
    e2e.add_argument(
        "--slow-peers",
        type=int,
        default=0,
        metavar="K",
        help="make K peers' training --slowdown times slower than the others' (their workers get "
        "1/slowdown of --worker-cores)",
    )
    e2e.add_argument(
        "--slowdown",
        type=float,
        default=4.0,
        help="how much slower a slow peer is than the others (default 4)",
    )
    e2e.add_argument(
        "--worker-cores",
        type=float,
        metavar="CORES",
        help="each training worker's CPU quota (default: 3/4 of this machine's cores split "
        "equally among the peers, so one peer's speed does not depend on how many others "
        "compute; 0: no quota)",
    )
    e2e.add_argument("--logs", metavar="DIR", help="keep every worker's log under DIR")
    e2e.add_argument("--target-loss", type=float, help="default: the worst final loss of the runs")
    add_output_arguments(e2e, "bench-results/e2e.json", "print one JSON object last, no table")
    e2e.add_argument(
        "--plot", default="bench-results/e2e.png", help="loss vs wall time (PNG; matplotlib)"
    )


def _add_nat_arguments(nat: argparse.ArgumentParser) -> None:
    from p2ptrain.harness.nat_bench import DEFAULT_CITIES, DEFAULT_NATS

    nat.add_argument(
        "--nats",
        default=",".join(DEFAULT_NATS),
        help="each peer's NAT, comma-separated: none, cone or symmetric (default: 3 public, "
        "3 cone, 2 symmetric); the bootstrap sits beside peer 0, which must be public",
    )
    nat.add_argument("--cities", default=",".join(DEFAULT_CITIES), help="cities of the peers")
    nat.add_argument("--seed", type=int, default=0, help="seed of the topology")
    nat.add_argument(
        "--bandwidth-scale", type=float, default=DEFAULT_BANDWIDTH_SCALE, help="as for e2e"
    )
    nat.add_argument("--steps", type=int, default=12, help="training steps")
    nat.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")
    nat.add_argument(
        "--kill-relay-at",
        type=int,
        metavar="STEP",
        help="kill the bootstrap (every NATed peer's first relay) after this step",
    )
    nat.add_argument(
        "--no-baseline", action="store_true", help="skip the all-public run of the same steps"
    )
    nat.add_argument("--workdir", metavar="DIR", help="keep the nodes' logs here")
    add_output_arguments(nat, "bench-results/nat.json", "print one JSON object last, no table")


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
    from p2ptrain.testbed.netns import require_root

    require_root()
    if args.kind == "nat":
        return _run_nat(args)
    return _run_e2e(args) if args.kind == "e2e" else _run_netem(args)


def _run_netem(args: argparse.Namespace) -> int:
    from p2ptrain.errors import UserError
    from p2ptrain.harness.netem_bench import render, run_netem_bench

    if args.links < 1 or args.seconds <= 0:
        raise UserError("--links must be >= 1 and --seconds > 0")
    topology = load_emulated_topology(args)
    result: dict[str, Any] = run_netem_bench(
        topology,
        num_links=args.links,
        bulk_s=args.seconds,
        progress=progress,
        **emulated_links(args),
    )
    out = write_result(args.out, result)
    print(json.dumps(result) if args.json else render(result) + f"\n\nwrote {out}")
    return 0 if result["pass"] else 1


def _run_nat(args: argparse.Namespace) -> int:
    import tempfile

    from p2ptrain.errors import UserError
    from p2ptrain.harness.nat_bench import NatSwarm, render, run_nat_bench
    from p2ptrain.records import RunSpec, load_run_spec
    from p2ptrain.testbed.nat import check_nat_type

    nats = tuple(check_nat_type(kind.strip()) for kind in args.nats.split(","))
    if len(nats) < 2 or nats[0] != "none":
        raise UserError("--nats: at least 2 peers, and peer 0 (beside the bootstrap) public")
    if args.kill_relay_at is not None and not 0 <= args.kill_relay_at < args.steps - 6:
        raise UserError("--kill-relay-at must leave at least 6 steps after it")
    spec = load_run_spec(args.run) if args.run else RunSpec()
    spec = spec.replace(steps=args.steps, compute_aware=False)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="p2ptrain-bench-nat-"))
    cities = tuple(c.strip() for c in args.cities.split(",") if c.strip())
    swarm = NatSwarm(nats, cities, args.seed, args.bandwidth_scale)
    result = run_nat_bench(spec, swarm, workdir, args.kill_relay_at, not args.no_baseline, progress)
    out = write_result(args.out, result)
    if not args.json:
        print(render(result) + f"\n\nwrote {out} (logs in {workdir})")
    contract = {k: result[k] for k in ("peers", "steps", "loss", "relay_bytes")}
    print(json.dumps({**contract, **result}))
    return 0 if result["pass"] else 1


def _run_e2e(args: argparse.Namespace) -> int:
    from p2ptrain.errors import UserError
    from p2ptrain.harness.e2e_bench import (
        RUN_ORDER,
        failure_summary,
        render,
        run_e2e_bench,
        worker_quotas,
        worker_shares,
    )
    from p2ptrain.harness.e2e_plot import write_loss_plot
    from p2ptrain.records.run import load_run_spec
    from p2ptrain.testbed.cpu import quotas_from_topology_file

    if args.steps < 3:
        raise UserError("--steps must be at least 3")
    if args.random_seeds < 1:
        raise UserError("--random-seeds must be at least 1")
    default_runs = RUN_ORDER
    runs = tuple(r.strip() for r in (args.runs or ",".join(default_runs)).split(",") if r.strip())
    if not runs or set(runs) - set(RUN_ORDER):
        raise UserError(f"--runs takes some of {', '.join(RUN_ORDER)}")
    if not args.slowdown >= 1:
        raise UserError(f"--slowdown must be >= 1, got {args.slowdown}")
    spec = load_run_spec(args.run).replace(steps=args.steps)
    if args.stages is not None:
        spec = spec.replace(stages=args.stages)
    topology = load_emulated_topology(args)
    if not 0 <= args.slow_peers <= topology.num_peers:
        raise UserError(f"--slow-peers must be between 0 and {topology.num_peers}")
    cores = quotas_from_topology_file(args.topology, topology.peers) if args.topology else {}
    share = worker_shares(topology.num_peers) if args.worker_cores is None else args.worker_cores
    if share < 0 or (args.slow_peers and share == 0):
        raise UserError("--worker-cores must be >= 0, and > 0 with --slow-peers")
    compute_cores = worker_quotas(topology.num_peers, share, args.slow_peers, args.slowdown)
    try:
        result = run_e2e_bench(
            topology,
            spec,
            **emulated_links(args),
            seed=args.seed,
            target_loss=args.target_loss,
            progress=progress,
            random_seeds=args.random_seeds,
            runs=runs,
            log_dir=Path(args.logs) if args.logs else None,
            cpu_cores=cores,
            compute_cores=compute_cores,
        )
    except (RuntimeError, TimeoutError) as exc:
        raise UserError(f"the emulated swarm failed ({failure_summary(exc)})") from exc
    result["network"] = {
        "peers": topology.num_peers,
        "name": topology.name,
        "topology": args.topology,
        "cities": None if args.topology else args.cities,
    }
    out = write_result(args.out, result)
    curves = {k: result[k]["curve"] for k in RUN_ORDER if "curve" in result.get(k, {})}
    write_loss_plot(Path(args.plot), curves, title=f"bench e2e: {topology.num_peers} peers")
    if not args.json:
        print(render(result) + f"\n\nwrote {out} and {args.plot}")
    else:
        print(json.dumps(result))
    return 0


KINDS = {
    "netem": Kind(
        "emulated links (root): configured vs measured RTT and throughput",
        _add_netem_arguments,
        run_kind,
    ),
    "e2e": Kind(
        "train on the emulated WAN (root): scheduled vs random placement vs hivemind DP",
        _add_e2e_arguments,
        run_kind,
    ),
    "nat": Kind(
        "a swarm with peers behind emulated cone and symmetric NATs trains (root): "
        "reachability, hole punches, relays",
        _add_nat_arguments,
        run_kind,
    ),
}
