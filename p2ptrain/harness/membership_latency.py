"""How soon a membership change reaches the other peers as a new plan, on loopback.

    python -m p2ptrain.harness.membership_latency [--peers 5] [--changes 10]
                                                  [--tree PATH ...] [--json FILE]

A bootstrap and `--peers` `join --control-only` nodes, each a real process tree on 127.0.0.1
started through the CLI; once they share a plan, `--changes` membership changes in turn: a
member SIGKILLed, a new one joined, a member SIGTERMed, a new one joined, ... (never the planner:
its failover is an election, timed elsewhere). Per change, the latency of each other member is
from the change (the signal; for a join, the new node's first stdout line: it listens) to the
log line where its view adopts the planner's next plan that holds the new membership (control
only nodes have no worker: the worker link's hand-over comes after this line). Each `--tree`
(a source checkout, e.g. a `git worktree` of an older commit) runs the same scenario in turn,
with PYTHONPATH set to it: before and after in one run. Loopback only; nothing else is dialled.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from p2ptrain import identity, procs
from p2ptrain.flags import python_module
from p2ptrain.records import issue_token

LOOPBACK = ("--listen", "/ip4/127.0.0.1/tcp/0")
STARTUP_TIMEOUT_S = 60.0
FIRST_PLAN_TIMEOUT_S = 180.0
CHANGE_TIMEOUT_S = 60.0
QUIET_S = 4.0  # no plan for this long before a change: the last one's debounce and floor are over
CHANGES = ("sigkill", "join", "sigterm", "join")
# the log lines of control/view.py ("accepted plan term 3 epoch 2 from ...") and of the
# planner ("published plan term 3 epoch 2: 5 peers, ...")
_PLAN_LINE = re.compile(
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3}) \S+ \S+: "
    r"(?:accepted|published) plan term ([0-9]+) epoch ([0-9]+)(?:: ([0-9]+) peers)?"
)


@dataclass
class PlanEvent:
    at: float  # wall-clock seconds (the log line's time)
    key: tuple[int, int]
    num_peers: int | None  # the planner's own line says how many it placed


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    peer_id: str
    started_at: float  # when it printed its address (listening)

    def plan_events(self) -> list[PlanEvent]:
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = _PLAN_LINE.match(line)
            if match is None:
                continue
            stamp, term, epoch, peers = match.groups()
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            events.append(
                PlanEvent(at, (int(term), int(epoch)), None if peers is None else int(peers))
            )
        return events


@dataclass
class Swarm:
    """A bootstrap and its members, for one source tree."""

    workdir: Path
    tree: Path | None
    bootstrap_addr: str = ""
    candidates: int | None = None  # the first this many joins hold planner tokens (None: all)
    members: list[Node] = field(default_factory=list)
    _all: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _count: int = 0

    def _start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path, str]:
        log_path = self.workdir / f"{name}.log"
        env = {} if self.tree is None else {"PYTHONPATH": str(self.tree)}
        proc = procs.spawn(
            python_module("p2ptrain", *argv),
            log_path=log_path,
            stdout=subprocess.PIPE,
            env=env,
            cwd=self.tree,
            die_with_parent=signal.SIGKILL,
        )
        self._all.append(proc)
        return proc, log_path, _first_line(proc, STARTUP_TIMEOUT_S)

    def start_bootstrap(self, num_peers: int) -> None:
        run = self.workdir / "run.toml"
        run.write_text(f"[run]\nworker_stall_s = 0.0\nmin_peers = {num_peers}\n")
        key = str(self.workdir / "boot.key")
        _, _, self.bootstrap_addr = self._start(
            "boot", ["bootstrap", "--identity", key, "--run", str(run), *LOOPBACK]
        )

    def join(self) -> Node:
        name = f"peer{self._count}"
        self._count += 1
        key_path = self.workdir / f"{name}.key"
        peer = identity.peer_id_of(identity.load_or_create_identity(key_path))
        organiser = identity.load_identity(self.workdir / "boot.key")
        planner = self.candidates is None or self._count <= self.candidates
        token = issue_token(organiser, peer, planner, time.time() + 86_400).encode()
        argv = ["join", "--control-only", *LOOPBACK, "--data-listen", "/ip4/127.0.0.1/tcp/0"]
        argv += ["--bootstrap", self.bootstrap_addr, "--identity", str(key_path)]
        proc, log_path, _ = self._start(name, [*argv, "--token", token])
        node = Node(name, proc, log_path, peer, time.time())
        self.members.append(node)
        return node

    def stop(self, node: Node, signum: int) -> float:
        """Signal the node's process group; the time it was sent."""
        self.members.remove(node)
        at = time.time()
        procs.kill_group(node.proc, signum)
        return at

    def planner(self) -> Node | None:
        """The member whose log has the latest 'published plan' line."""
        latest = max(
            ((e.at, n) for n in self.members for e in n.plan_events() if e.num_peers is not None),
            default=None,
            key=lambda pair: pair[0],
        )
        return None if latest is None else latest[1]

    def close(self) -> None:
        procs.stop_groups(self._all, grace_s=5.0)


def _first_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The first stdout line of proc (its address); the rest is drained in the background."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode(errors="replace").strip())
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    line = lines.get(timeout=timeout_s)
    if line is None:
        raise RuntimeError(f"{proc.args!r} exited ({proc.poll()}) before printing its address")
    return line


def _adoptions(swarm: Swarm, since: float, num_peers: int) -> dict[str, float] | None:
    """Each member's time of adopting the first plan after `since` that places `num_peers`
    (the planner's own line says so); None until every member has."""
    published = [
        e
        for n in swarm.members
        for e in n.plan_events()
        if e.at >= since and e.num_peers == num_peers
    ]
    if not published:
        return None
    key = min(published, key=lambda e: e.at).key
    found = {}
    for node in swarm.members:
        adopted = [e.at for e in node.plan_events() if e.at >= since and e.key >= key]
        if not adopted:
            return None
        found[node.name] = min(adopted) - since
    return found


def _wait_quiet(swarm: Swarm, num_peers: int, timeout_s: float) -> None:
    """Until every member holds a plan of `num_peers` and no plan came for QUIET_S."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        events = [e for n in swarm.members for e in n.plan_events()]
        last = max((e.at for e in events), default=None)
        if (
            last is not None
            and time.time() - last >= QUIET_S
            and _adoptions(swarm, 0.0, num_peers) is not None
        ):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no settled plan of {num_peers} peers within {timeout_s:.0f} s")


def run_scenario(tree: Path | None, num_peers: int, num_changes: int) -> dict[str, Any]:
    """One swarm on `tree` (None: the installed package) through `num_changes` changes."""
    with tempfile.TemporaryDirectory(prefix="p2ptrain-membership-") as tmp:
        swarm = Swarm(Path(tmp), tree)
        try:
            swarm.start_bootstrap(num_peers)
            for _ in range(num_peers):
                swarm.join()
            _wait_quiet(swarm, num_peers, FIRST_PLAN_TIMEOUT_S)
            changes = []
            for i in range(num_changes):
                kind = CHANGES[i % len(CHANGES)]
                planner = swarm.planner()
                if kind == "join":
                    node = swarm.join()
                    changed_at = node.started_at
                else:
                    victim = next(n for n in swarm.members if n is not planner)
                    sig = signal.SIGKILL if kind == "sigkill" else signal.SIGTERM
                    changed_at = swarm.stop(victim, sig)
                num_now = len(swarm.members)
                others = [n.name for n in swarm.members if kind != "join" or n is not node]
                deadline = changed_at + CHANGE_TIMEOUT_S
                adopted = None
                while adopted is None and time.time() < deadline:
                    time.sleep(0.2)
                    adopted = _adoptions(swarm, changed_at, num_now)
                if adopted is None:
                    raise TimeoutError(f"change {i} ({kind}): no plan of {num_now} peers")
                latencies = [adopted[name] for name in others]
                changes.append(
                    {
                        "kind": kind,
                        "median_s": round(statistics.median(latencies), 3),
                        "all_s": round(max(latencies), 3),
                    }
                )
                print(f"  change {i}: {kind:7s} {changes[-1]}", file=sys.stderr, flush=True)
                _wait_quiet(swarm, num_now, CHANGE_TIMEOUT_S)
        finally:
            swarm.close()
    return summarize(changes, tree)


def summarize(changes: list[dict[str, Any]], tree: Path | None) -> dict[str, Any]:
    by_kind: dict[str, list[float]] = {}
    for change in changes:
        by_kind.setdefault(change["kind"], []).append(change["median_s"])
    return {
        "tree": str(tree) if tree is not None else "installed",
        "changes": changes,
        "median_s": round(statistics.median(c["median_s"] for c in changes), 3),
        "median_all_s": round(statistics.median(c["all_s"] for c in changes), 3),
        "median_by_kind_s": {k: round(statistics.median(v), 3) for k, v in by_kind.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2ptrain.harness.membership_latency")
    parser.add_argument("--peers", type=int, default=5)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--tree", action="append", type=Path, default=[])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    procs.raise_open_file_limit()
    results = []
    for tree in args.tree or [None]:
        print(f"tree {tree or 'installed'}:", file=sys.stderr, flush=True)
        results.append(run_scenario(tree, args.peers, args.changes))
    for result in results:
        print(
            f"{result['tree']}: median {result['median_s']:.2f} s over {len(result['changes'])} "
            f"changes (all members: {result['median_all_s']:.2f} s); "
            f"by kind {result['median_by_kind_s']}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
