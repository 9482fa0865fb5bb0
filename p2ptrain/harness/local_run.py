"""`p2ptrain local`'s engine: a bootstrap and N nodes through the real node CLIs.

Starts `p2ptrain bootstrap` and N `p2ptrain join` process trees (supervisor, control process,
worker), lets the control plane discover, measure, elect a planner and publish plans, and follows
every worker's steps through the metrics files they append to (join --metrics-log). Where the
nodes run is a NodeSites: loopback here; the WAN testbed puts node i in namespace i
(p2ptrain/harness/testbed_sites.py). Stdlib only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from p2ptrain import identity, procs
from p2ptrain.addresses import LOOPBACK
from p2ptrain.flags import python_module
from p2ptrain.harness.direct_swarm import StepStats, SwarmResult, count_outcomes
from p2ptrain.harness.start_notes import StartNotes
from p2ptrain.ipc_lines import decode
from p2ptrain.records import Message, MetricsReport, Plan, RunSpec, SessionReport, issue_token
from p2ptrain.worker.faults import NO_FAULTS, Faults
from p2ptrain.worker.node_paths import own_copies
from p2ptrain.worker.settings import DEFAULT_DEVICE

START_TIMEOUT_S = 60.0
STALL_TIMEOUT_S = 240.0
# a supervisor's own stop: its worker saves within 30 s (node/supervisor.py STOP_GRACE_S); a
# SIGKILL before that orphans the worker, which then saves and exits on its own (within 30 s:
# worker/watchdog.py): `local` adopts such orphans and stops them as it stops the nodes
STOP_GRACE_S = 40.0
# the swarm's rate is read off when steps' reports were read (every POLL_S): over a shorter span
# than this, the workers' own measure of their steps
POLL_S = 0.2
MIN_RATE_SPAN_S = 20 * POLL_S
# after the last step's loss, how long the nodes get to finish and leave on their own
FINISH_S = 60.0
WITH_FAULTS = "p2ptrain.harness.with_faults"  # `join` and `local` with faults, for tests
TOKEN_LIFETIME_S = 7 * 86_400.0


class NodeSites:
    """Where the nodes of a local swarm run: all on 127.0.0.1, any port. Index -1 is the
    bootstrap. None: the command's default (`join`'s fixed ports on every interface)."""

    def listen(self, index: int) -> str | None:
        return LOOPBACK

    def data_listen(self, index: int) -> str | None:
        return LOOPBACK

    def command(self, index: int, argv: list[str]) -> list[str]:
        return argv

    def env(self, index: int) -> dict[str, str]:
        """Variables node `index` gets on top of ours."""
        return {}


def write_run_toml(spec: RunSpec, path: Path) -> None:
    """The spec as a run file ([run] and its sections)."""
    path.write_text(spec.to_toml())


def train_with_control_plane(
    spec: RunSpec,
    num_peers: int,
    workdir: Path,
    on_plan: Callable[[Plan], None],
    on_step: Callable[[int, float, float], None],
    sites: NodeSites | None = None,
    own_checkpoints: bool = False,
    faults: Faults | None = None,
    profile: bool = False,
    http: str | None = None,
    on_started: Callable[[str, list[subprocess.Popen[bytes]]], None] | None = None,
    before_stop: Callable[[], None] | None = None,
    on_report: Callable[[MetricsReport], None] | None = None,
    device: str = DEFAULT_DEVICE,
) -> SwarmResult:
    """Run the swarm until every step's loss is known; with `own_checkpoints`, node i keeps its
    checkpoints in workdir/peer-i/ instead of the run's shared checkpoint_dir. `faults` go to
    every node (harness/with_faults.py): each fires in whichever worker holds its role at its
    step; with `profile`, each worker adds its steps' CPU profiles to its metrics log
    (`join --profile`);
    `http`: the bootstrap serves its dashboard there (`bootstrap --http`); `on_started(address,
    processes)`: the bootstrap's address and every process tree (the bootstrap first), once all
    started; `before_stop()`: after the last step, while every node still runs;
    `on_report(metrics)`: every worker's every step as it reported it; `device`: every node's
    `--device` (they share it)."""
    sites = sites or NodeSites()
    # a killed node's worker is ours to stop, not PID 1's (`_stop`); what we started before
    # this swarm (a testbed's forwarder) is not
    ours = set(procs.children())
    procs.adopt_orphans()
    run_path = workdir / "run.toml"
    # the first plan waits for all N peers instead of re-planning as each one joins
    write_run_toml(spec.replace(min_peers=num_peers), run_path)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        args = [
            "bootstrap",
            "--identity",
            str(workdir / "bootstrap.key"),
            "--run",
            str(run_path),
            *_flag("--listen", sites.listen(-1)),
            *_flag("--http", http),
        ]
        boot = _start(sites, -1, args, workdir / "bootstrap.log", stdout=subprocess.PIPE)
        nodes.append(boot)
        address = _first_line(boot, START_TIMEOUT_S)
        logs = [workdir / f"metrics-{i}.jsonl" for i in range(num_peers)]
        organiser = identity.load_identity(workdir / "bootstrap.key")
        for i in range(num_peers):
            key = workdir / f"peer-{i}.key"
            # every node of a local run may plan: the organiser's planner token for it; one
            # torch thread each (the nodes share this machine's cores)
            token = issue_token(
                organiser,
                identity.peer_id_of(identity.load_or_create_identity(key)),
                True,
                time.time() + TOKEN_LIFETIME_S,
            ).encode()
            args = [
                "join",
                "--bootstrap",
                address,
                "--identity",
                str(key),
                "--token",
                token,
                *_flag("--listen", sites.listen(i)),
                *_flag("--data-listen", sites.data_listen(i)),
                "--metrics-log",
                str(logs[i]),
                "--threads",
                "1",
                "--device",
                device,
            ]
            if own_checkpoints:
                args += ["--checkpoint-dir", str(workdir / f"peer-{i}" / "checkpoints")]
            elif spec.checkpoint.checkpoint_dir:  # ours to name: a worker takes only a relative
                args += ["--checkpoint-dir", spec.checkpoint.checkpoint_dir]  # one from a spec
            args += _own_data(spec)
            if profile:
                args.append("--profile")
            nodes.append(_start(sites, i, args, workdir / f"peer-{i}.log", faults=faults))  # join's
            # stdout too: its "waiting for" lines (harness/start_notes.py)
        if on_started is not None:
            on_started(address, nodes)
        node_logs = [workdir / f"peer-{i}.log" for i in range(num_peers)]
        result = _follow(spec, logs, node_logs, nodes[1:], on_plan, on_step, on_report)
        if before_stop is not None:
            before_stop()
        _wait_for_exits(nodes[1:], FINISH_S)
        return _with_all_outcomes(result, logs)
    finally:
        _stop(nodes, ours)


def command(subcommand: str, args: Sequence[str], faults: Faults) -> list[str]:
    """The command line that runs `p2ptrain SUBCOMMAND ARGS`, through the harness's entry point
    if there are `faults` to inject (harness/with_faults.py), else the product's own command."""
    if not faults.items:
        return python_module("p2ptrain", subcommand, *args)
    return python_module(WITH_FAULTS, subcommand, *args, *faults.to_argv())


def _flag(flag: str, value: str | None) -> list[str]:
    return [] if value is None else [flag, value]


def _own_data(spec: RunSpec) -> list[str]:
    """The data and tokenizer the user's own run spec names, as its nodes' own copies: a node
    reads a spec's unpinned path only inside its working directory (worker/node_paths.py)."""
    corpus, tokenizer = own_copies(spec)
    return [*_flag("--corpus", corpus), *_flag("--tokenizer", tokenizer)]


def _start(
    sites: NodeSites,
    index: int,
    args: list[str],
    log_path: Path,
    stdout: int | None = None,
    faults: Faults | None = None,
) -> subprocess.Popen[bytes]:
    return procs.spawn(
        sites.command(index, command(args[0], args[1:], faults or NO_FAULTS)),
        log_path=log_path,
        stdout=stdout,
        env=sites.env(index),
        die_with_parent=signal.SIGTERM,  # a graceful node stop if `p2ptrain local` dies
    )


def _first_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    stdout = proc.stdout
    assert stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stdout.readline().decode()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not lines or not lines[0].strip():
        raise RuntimeError("the bootstrap did not print its address")
    if not lines[0].startswith("/"):  # a multiaddr: anything else is how it failed to start
        raise RuntimeError(f"the bootstrap did not start: it printed {lines[0].strip()!r}")
    return lines[0].strip()


def _follow(
    spec: RunSpec,
    logs: list[Path],
    node_logs: list[Path],
    peers: list[subprocess.Popen[bytes]],
    on_plan: Callable[[Plan], None],
    on_step: Callable[[int, float, float], None],
    on_report: Callable[[MetricsReport], None] | None = None,
) -> SwarmResult:
    """Read the workers' reports (`logs`) until every step's loss is known from its latest plan
    epoch; until the first, say what the nodes wait for (their `node_logs`)."""
    started_s = time.monotonic()
    offsets = [0] * len(logs)
    plan: Plan | None = None
    # a re-plan re-runs steps from the agreed start step: per step, the reports of the newest plan
    # (term, epoch) win, and a step counts once every replica of that plan has reported it
    by_step: dict[int, StepStats] = {}
    plan_of_step: dict[int, tuple[int, int]] = {}
    averaging: dict[str, int] = {}
    outer: dict[str, int] = {}
    losses: dict[int, float] = {}
    finished_s: list[float] = []
    deadline = time.monotonic() + STALL_TIMEOUT_S
    # before the first step, what the nodes wait for
    notes = StartNotes(node_logs, started_s)
    # a swarm that resumed a run (worker/resume/adopt.py) reports from its start step on: done when
    # the last step's loss is known
    while spec.optim.steps - 1 not in losses:
        if time.monotonic() > deadline:
            raise TimeoutError("the swarm made no progress in time")
        if not losses:
            notes.tick(plan)
        all_exited = all(p.poll() is not None for p in peers)  # checked before the last read
        for i, path in enumerate(logs):
            for message in _new_lines(path, offsets, i):
                deadline = time.monotonic() + STALL_TIMEOUT_S
                if isinstance(message, SessionReport) and (
                    plan is None or message.plan.key > plan.key
                ):
                    plan = message.plan
                    on_plan(plan)
                if not isinstance(message, MetricsReport):
                    continue
                if on_report is not None:
                    on_report(message)
                count_outcomes(message, averaging, outer)
                if message.loss is None:
                    continue
                step, key = message.step, message.plan_key
                if key < plan_of_step.get(step, key):
                    continue  # a report from an older plan
                if key > plan_of_step.get(step, key):
                    by_step.pop(step, None)  # the step is being re-run under a newer plan
                plan_of_step[step] = key
                stats = by_step.setdefault(step, StepStats())
                stats.add(message)
                if set(stats.losses) >= set(range(message.num_replicas)):
                    new = step not in losses
                    losses[step] = stats.global_loss()
                    if new:
                        finished_s.append(time.monotonic())
                        on_step(step, losses[step], sum(stats.tokens_per_s.values()))
        if all_exited and spec.optim.steps - 1 not in losses:
            raise RuntimeError(f"every peer exited after {len(losses)} of {spec.optim.steps} steps")
        time.sleep(POLL_S)
    wall_s = time.monotonic() - started_s
    ordered = [losses[s] for s in sorted(losses)]
    tokens_per_step = spec.optim.batch_size * spec.model.block_size
    span_s = finished_s[-1] - finished_s[0] if len(finished_s) > 1 else 0.0
    if span_s >= MIN_RATE_SPAN_S:
        tokens_per_s = (len(finished_s) - 1) * tokens_per_step / span_s
    else:  # a few steps read in one or two polls: their stamps say nothing; the workers' own rate
        rates = sorted(sum(stats.tokens_per_s.values()) for stats in by_step.values())
        tokens_per_s = rates[len(rates) // 2] if rates else 0.0
    assert plan is not None  # every step's loss came from a session's reports
    first = min(losses)
    return SwarmResult(len(ordered), ordered, tokens_per_s, plan, averaging, wall_s, first, outer)


def _with_all_outcomes(result: SwarmResult, logs: list[Path]) -> SwarmResult:
    """`result` counting every report the workers wrote: the first stages report the last
    step, and their last outer round, after the last stages' loss ended `_follow`."""
    averaging: dict[str, int] = {}
    outer: dict[str, int] = {}
    for i, path in enumerate(logs):
        for message in _new_lines(path, [0] * len(logs), i):
            if isinstance(message, MetricsReport):
                count_outcomes(message, averaging, outer)
    return dataclasses.replace(result, averaging=averaging, outer_rounds=outer)


def _new_lines(path: Path, offsets: list[int], index: int) -> list[Message]:
    try:
        with open(path, "rb") as f:
            f.seek(offsets[index])
            data = f.read()
    except FileNotFoundError:
        return []
    complete = data[: data.rfind(b"\n") + 1]
    offsets[index] += len(complete)
    return [m for m in map(decode, complete.splitlines()) if m is not None]


def _wait_for_exits(peers: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """The last step's loss is known once the last stages reported it, before the first ones
    ran their backward, their round and their save: a placed node leaves once its worker has
    saved the last step, a spare once the run is finished. Stopping them all at once cut the
    first stages' last step (a stage checkpointed a step behind, a last round not applied)."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in peers):
        if time.monotonic() > deadline:
            print(
                f"the nodes did not all leave {timeout_s:.0f} s after the last step: stopping them",
                file=sys.stderr,
                flush=True,
            )
            return
        time.sleep(POLL_S)


def _stop(nodes: list[subprocess.Popen[bytes]], ours: set[int]) -> None:
    """SIGTERM every node twice (supervisors stop their children; the whole swarm stops, so the
    second signal cuts short a hand-over that would wait for a successor), then SIGKILL what is
    left; then stop the orphans handed to us (children but the nodes and `ours`)."""
    for node in nodes[::-1]:  # peers first, the bootstrap last
        if node.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                node.send_signal(signal.SIGTERM)
    time.sleep(0.2)  # two signals, not one: a signal pending twice is handled once
    procs.stop_groups(nodes[::-1], STOP_GRACE_S)  # peers first, the bootstrap last
    procs.stop_orphans(ours | {node.pid for node in nodes}, STOP_GRACE_S, _say_orphans)


def _say_orphans(pids: list[int]) -> None:
    print(
        f"waiting up to {STOP_GRACE_S:.0f} s for {len(pids)} process(es) that nodes which died "
        f"left behind (an orphaned worker saves its stage first): {pids}",
        file=sys.stderr,
        flush=True,
    )
