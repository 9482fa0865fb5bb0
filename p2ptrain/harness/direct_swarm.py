"""N workers on this machine, driven through the control <-> worker IPC without a control plane.

This plays the control side of the worker socket (records/messages.py) on 127.0.0.1: it listens
on one Unix socket, starts N worker processes (each its own process group), collects their hellos, computes a
plan with the scheduler over a loopback topology, sends it, gathers the metrics and finally stops
everything. Tests, `p2ptrain local --direct` and `bench e2e` (as EmulatedSwarm) use it. Stdlib
only (it never imports hivemind or libp2p).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from p2ptrain.harness.process_swarm import ProcessSwarm
from p2ptrain.ipc_lines import LineBuffer, decode, encode
from p2ptrain.records import Hello, Message, MetricsReport, Plan, PlanMessage, RunSpec, Stop
from p2ptrain.worker.node_paths import own_copies
from p2ptrain.worker.settings import DEFAULT_DEVICE, WorkerSettings

STALL_TIMEOUT_S = 180.0  # no progress for this long: the swarm is broken
STOP_GRACE_S = 20.0


@dataclass
class StepStats:
    """What the last stages of all replicas reported for one step."""

    losses: dict[int, float] = field(default_factory=dict)  # replica -> loss
    samples: dict[int, int] = field(default_factory=dict)
    tokens_per_s: dict[int, float] = field(default_factory=dict)

    def add(self, report: MetricsReport) -> None:
        """A last stage's report of the step (it carries the loss)."""
        assert report.loss is not None
        self.losses[report.replica] = report.loss
        self.samples[report.replica] = report.samples
        self.tokens_per_s[report.replica] = report.tokens_per_s

    def global_loss(self) -> float:
        """The loss over the global batch: replicas weighted by their rows."""
        total = sum(self.samples.values())
        return sum(self.losses[r] * self.samples[r] / total for r in self.losses)


@dataclass
class SwarmResult:
    steps: int
    loss: list[float]
    tokens_per_s: float
    plan: Plan
    averaging: dict[str, int]  # outcome -> count over all peers and steps
    wall_s: float
    first_step: int = 0  # the first step trained: > 0 when the swarm resumed the run
    # sync = "diloco": what the stages' outer rounds did (outcome -> count over peers; a round
    # counts when it is applied, "started" a few steps before)
    outer_rounds: dict[str, int] = field(default_factory=dict)


def count_outcomes(
    message: MetricsReport, averaging: dict[str, int], outer: dict[str, int]
) -> None:
    """Add a worker's step report to the per-step averaging and outer-round counts."""
    averaging[message.averaging] = averaging.get(message.averaging, 0) + 1
    if message.outer_round and message.outer_round != "started":
        outer[message.outer_round] = outer.get(message.outer_round, 0) + 1


def plan_layout(spec: RunSpec, num_peers: int) -> tuple[int, int]:
    """(stages, replicas) for a local swarm: the run's stages, fewer if there are too few peers."""
    stages = max(1, min(spec.swarm.stages, num_peers, spec.model.n_layer))
    return stages, num_peers // stages


def plan_for(spec: RunSpec, hellos: list[Hello], epoch: int = 0) -> Plan:
    """A plan placing the hello'd peers, with the scheduler when it loads."""
    peers = [h.peer_id for h in hellos]
    stages, replicas = plan_layout(spec, len(peers))
    try:
        if len(peers) == 1:
            raise ImportError("nothing to schedule")  # and the scheduler wants two peers
        import numpy as np

        from p2ptrain.schedule import Topology, plan_swarm
        from p2ptrain.schedule.workload import planning_workload

        n = len(peers)
        topology = Topology(
            peers=peers,
            delay_ms=np.full((n, n), 0.05) - np.diag(np.full(n, 0.05)),  # loopback
            bandwidth_gbps=np.full((n, n), 10.0),
            workload=planning_workload(spec, stages, replicas),
        )
        plan = plan_swarm(
            topology, stages=stages, replicas=replicas, seed=spec.optim.seed, time_budget_s=0.5
        )
        pipelines = [[peers[i] for i in pipeline] for pipeline in plan.pipelines]
        spares = [peers[i] for i in plan.spares]
        planner, cost_s = "plan_swarm", float(plan.cost_s)
    except ImportError:  # one peer, or no scheduler installed: the obvious layout
        pipelines = [peers[r * stages : (r + 1) * stages] for r in range(replicas)]
        spares, planner, cost_s = peers[stages * replicas :], "static", 0.0
    return Plan(
        term=0,
        epoch=epoch,
        planner=planner,
        stages=stages,
        pipelines=tuple(tuple(p) for p in pipelines),
        spares=tuple(spares),
        data_addrs={h.peer_id: h.data_addrs for h in hellos},
        cost_s=cost_s,
    )


class LocalSwarm(ProcessSwarm):
    """Start with `with LocalSwarm(...) as swarm:`; every process group is killed on exit."""

    LOG = "worker-{index}.log"

    def __init__(
        self,
        spec: RunSpec,
        num_peers: int,
        workdir: Path,
        worker_flags: dict[int, list[str]] | None = None,
        env: dict[str, str] | None = None,
        device: str = DEFAULT_DEVICE,
    ) -> None:
        """worker_flags: extra flags of worker i (worker/settings.py); env: variables every worker
        gets on top of ours; device: every worker's `--device` (they share it)."""
        super().__init__(workdir)
        self.spec = spec
        self.num_peers = num_peers
        self.worker_flags = worker_flags or {}
        self.env = env or {}
        self.device = device
        self.may_die: set[int] = set()  # workers a test kills on purpose
        self.hellos: list[Hello] = []
        self.plan: Plan | None = None
        self._messages: queue.Queue[tuple[int, Message | None]] = queue.Queue()
        self._conns: list[socket.socket] = []
        self._conn_of_peer: dict[str, socket.socket] = {}
        self._listener: socket.socket | None = None

    def __enter__(self) -> LocalSwarm:
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = str(self.workdir / "ipc.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(self.num_peers)
        self.start_all(self.num_peers, lambda index: self._start_worker(index, path))
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_worker(self, index: int, ipc_path: str) -> None:
        # the spec is the test's own: its folder and data, as a node's flags (a spec's
        # absolute paths are not taken from the organiser: worker/node_paths.py)
        folder = self.spec.checkpoint.checkpoint_dir or None
        corpus, tokenizer = own_copies(self.spec)
        settings = WorkerSettings(
            ipc=ipc_path,
            device=self.device,
            checkpoint_dir=folder,
            corpus=corpus,
            tokenizer=tokenizer,
        )
        argv = [*settings.command(), *self.worker_flags.get(index, [])]
        self.spawn(index, self._command(index, argv), env=self.env)

    def _command(self, index: int, argv: list[str]) -> list[str]:
        """The command line that runs worker `index` (here: argv itself)."""
        return argv

    def wait_hellos(self, timeout_s: float = 120.0) -> list[Hello]:
        """Accept every worker's connection and hello; the hellos in worker order."""
        assert self._listener is not None
        self._listener.settimeout(1.0)
        deadline = time.monotonic() + timeout_s
        while len(self._conns) < self.num_peers:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self._conns)} of {self.num_peers} workers connected")
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._conns.append(conn)
            threading.Thread(
                target=self._read, args=(len(self._conns) - 1, conn), daemon=True
            ).start()
        hellos: dict[int, Hello] = {}
        while len(hellos) < self.num_peers:
            index, message = self._next_message(deadline)
            if isinstance(message, Hello):
                hellos[index] = message
        # in worker order (connections arrive in any order)
        by_pid = {h.pid: h for h in hellos.values()}
        self.hellos = [by_pid[proc.pid] for proc in self.procs]
        self._conn_of_peer = {h.peer_id: self._conns[i] for i, h in hellos.items()}
        return self.hellos

    def send_plan(self, plan: Plan, stop_spares: bool = True) -> None:
        """Send `plan` to every worker; then stop its spares unless told not to (a test whose
        spare takes part in the start-step agreement)."""
        self.plan = plan
        self._broadcast(PlanMessage(plan, self.spec))
        for spare in plan.spares if stop_spares else ():  # nobody re-plans a local swarm
            with contextlib.suppress(OSError):
                self._conn_of_peer[spare].sendall(encode(Stop()))

    def train(self, on_step: Callable[[int, float, float], None] | None = None) -> SwarmResult:
        """Wait for every step's loss from the last stages, then for the workers to finish."""
        started_s = time.monotonic()
        assert self.plan is not None, "send_plan first"
        replicas = self.plan.num_replicas
        by_step: dict[int, StepStats] = {}
        averaging: dict[str, int] = {}
        outer: dict[str, int] = {}
        losses: list[float] = []
        finished_s: list[float] = []  # when each step's loss was complete
        next_step = None
        deadline = time.monotonic() + STALL_TIMEOUT_S
        while next_step is None or next_step < self.spec.optim.steps:
            _, message = self._next_message(deadline)
            if not isinstance(message, MetricsReport):
                continue
            deadline = time.monotonic() + STALL_TIMEOUT_S
            count_outcomes(message, averaging, outer)
            if message.loss is None:
                continue
            next_step = message.step if next_step is None else next_step  # a resumed run
            by_step.setdefault(message.step, StepStats()).add(message)
            while next_step in by_step and len(by_step[next_step].losses) == replicas:
                done = by_step.pop(next_step)
                losses.append(done.global_loss())
                finished_s.append(time.monotonic())
                if on_step is not None:
                    on_step(next_step, losses[-1], sum(done.tokens_per_s.values()))
                next_step += 1
        wall_s = time.monotonic() - started_s
        for _, message in self.collect_until_exit(STOP_GRACE_S):  # the other stages' last metrics
            if isinstance(message, MetricsReport):
                count_outcomes(message, averaging, outer)
        tokens_per_s = self._tokens_per_s(finished_s)
        return SwarmResult(
            len(losses), losses, tokens_per_s, self.plan, averaging, wall_s, 0, outer
        )

    def _tokens_per_s(self, finished_s: list[float]) -> float:
        """Steady-state throughput: tokens of the steps after the first over their wall time."""
        tokens_per_step = self.spec.optim.batch_size * self.spec.model.block_size
        if len(finished_s) < 2 or finished_s[-1] <= finished_s[0]:
            return 0.0
        return (len(finished_s) - 1) * tokens_per_step / (finished_s[-1] - finished_s[0])

    def collect_until_exit(self, timeout_s: float) -> list[tuple[int, Message]]:
        """Every message until all workers not in `may_die` have exited: (worker index, message)."""
        deadline = time.monotonic() + timeout_s
        messages = []
        while any(p.poll() is None for i, p in enumerate(self.procs) if i not in self.may_die):
            self._check_alive()
            if time.monotonic() > deadline:
                break
            try:
                index, message = self._messages.get(timeout=0.2)
            except queue.Empty:
                continue
            if message is not None:
                messages.append((index, message))
        while not self._messages.empty():
            index, message = self._messages.get()
            if message is not None:
                messages.append((index, message))
        return messages

    def wait_exit(
        self, timeout_s: float = STOP_GRACE_S, only: Collection[int] | None = None
    ) -> list[int | None]:
        """Wait for the workers (`only` those) to exit on their own (after the last step)."""
        return super().wait_exit(timeout_s, only)

    def stop(self) -> None:
        """Ask for a graceful stop (checkpoint), then kill whatever is left, group by group."""
        if any(proc.poll() is None for proc in self.procs):
            self._broadcast(Stop())
            self.wait_exit()
        self.kill()

    def kill(self) -> None:
        super().kill()  # worker, watchdog, hivemind children, p2pd
        for conn in self._conns:
            conn.close()
        if self._listener is not None:
            self._listener.close()
            Path(self.workdir / "ipc.sock").unlink(missing_ok=True)
            self._listener = None

    def _broadcast(self, message: Message) -> None:
        line = encode(message)
        for conn in self._conns:
            with contextlib.suppress(OSError):  # that worker is gone; the others go on
                conn.sendall(line)

    def _read(self, index: int, conn: socket.socket) -> None:
        lines = LineBuffer()
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._messages.put((index, None))
                return
            for line in lines.feed(data):
                message = decode(line)
                if message is not None:
                    self._messages.put((index, message))

    def _next_message(self, deadline: float) -> tuple[int, Message | None]:
        while True:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the swarm made no progress in time")
            try:
                return self._messages.get(timeout=0.5)
            except queue.Empty:
                continue

    def _check_alive(self) -> None:
        for index, proc in enumerate(self.procs):
            code = proc.poll()
            if code not in (None, 0) and index not in self.may_die:
                raise RuntimeError(f"worker {index} exited with {code}:\n{self.log_tail(index)}")
