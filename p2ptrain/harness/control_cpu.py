"""How much CPU a control process uses in steady state, on loopback (issue 29).

    python -m p2ptrain.harness.control_cpu [--peers 8] [--candidates N] [--settle 20]
                                           [--measure 40] [--tree PATH ...] [--json FILE]

A bootstrap and `--peers` `join --control-only` nodes, each a real process tree on 127.0.0.1
started through the CLI (harness/membership_latency.py's swarm; `--candidates N`: only the first
N hold planner tokens, the others members' tokens, as a community run is organised); once they share a plan and
no plan came for a few seconds, `--settle` seconds pass, then each node's process tree's CPU
seconds (user + system, /proc/PID/stat) are read over `--measure` seconds. Prints each node's
share of one core (median, max over the joined nodes; the bootstrap apart) and the swarm's
total in cores. Each `--tree` (a source checkout, e.g. a `git worktree` of an older commit)
runs the same scenario in turn: before and after in one run. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from p2ptrain import procs
from p2ptrain.harness.membership_latency import FIRST_PLAN_TIMEOUT_S, Swarm, _wait_quiet

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def process_tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc (the supervisor and its control process)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def measure(trees: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """Each tree's CPU over `seconds`, as a share of one core."""
    before = {name: sum(cpu_s(pid) for pid in pids) for name, pids in trees.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {
        name: (sum(cpu_s(pid) for pid in pids) - before[name]) / elapsed
        for name, pids in trees.items()
    }


def run_scenario(
    tree: Path | None,
    num_peers: int,
    settle_s: float,
    measure_s: float,
    keep: Path | None,
    candidates: int | None = None,
) -> Any:
    with tempfile.TemporaryDirectory(prefix="p2ptrain-control-cpu-") as tmp:
        workdir = Path(tmp) if keep is None else keep
        workdir.mkdir(parents=True, exist_ok=True)
        swarm = Swarm(workdir, tree, candidates=candidates)
        try:
            swarm.start_bootstrap(num_peers)
            for _ in range(num_peers):
                swarm.join()
            _wait_quiet(swarm, num_peers, FIRST_PLAN_TIMEOUT_S)
            time.sleep(settle_s)
            trees = {node.name: process_tree(node.proc.pid) for node in swarm.members}
            trees["boot"] = process_tree(swarm._all[0].pid)  # started first
            shares = measure(trees, measure_s)
        finally:
            swarm.close()
    peers = [share for name, share in shares.items() if name != "boot"]
    return {
        "tree": str(tree) if tree is not None else "installed",
        "peers": num_peers,
        "candidates": candidates,
        "measure_s": measure_s,
        "node_median_core": round(statistics.median(peers), 4),
        "node_max_core": round(max(peers), 4),
        "bootstrap_core": round(shares["boot"], 4),
        "total_cores": round(sum(shares.values()), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2ptrain.harness.control_cpu")
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=None, help="planner-token holders")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the plan")
    parser.add_argument("--measure", type=float, default=40.0, help="seconds measured")
    parser.add_argument("--tree", action="append", type=Path, default=[])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the nodes' logs here")
    args = parser.parse_args(argv)
    procs.raise_open_file_limit()
    results = []
    for tree in args.tree or [None]:
        print(f"tree {tree or 'installed'}:", file=sys.stderr, flush=True)
        result = run_scenario(
            tree, args.peers, args.settle, args.measure, args.keep, args.candidates
        )
        print(
            f"{result['tree']}: {args.peers} peers, per node {result['node_median_core']:.1%} "
            f"of a core (median), {result['node_max_core']:.1%} (max); bootstrap "
            f"{result['bootstrap_core']:.1%}; swarm {result['total_cores']:.2f} cores",
            flush=True,
        )
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
