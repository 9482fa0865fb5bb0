"""Helpers for control-plane integration tests: start a bootstrap and peers through the shipped
CLI, poll status.

The argv builders (bootstrap_argv, join_argv) give the command lines; start_node starts one and
reads its multiaddr; start_bootstrap_with, start_bootstrap and start_peer are the usual ways to
call them on loopback, with keys, logs and tokens in a test's tmp directory."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p2ptrain import identity
from p2ptrain.records import issue_token
from tests.conftest import PYTHON, REPO_ROOT, ProcessReaper

STARTUP_TIMEOUT_S = 60.0
# many nodes on one machine: loopback, any port (the defaults are fixed ports on every interface)
BOOTSTRAP_LOOPBACK = ("--listen", "/ip4/127.0.0.1/tcp/0")
JOIN_LOOPBACK = (*BOOTSTRAP_LOOPBACK, "--data-listen", "/ip4/127.0.0.1/tcp/0")
# the command that runs p2ptrain; a test prepends e.g. SOFT_NOFILE to it to limit a node
P2PTRAIN = (PYTHON, "-m", "p2ptrain")
# a soft open-file limit of 1024 (the usual default of a service), the hard one unchanged
SOFT_NOFILE = ("prlimit", "--nofile=1024:")
CONTROL_RUN = "[run]\nworker_stall_s = 0.0\n"


def bootstrap_argv(
    tmp: Path,
    *flags: str,
    cli: Sequence[str] = P2PTRAIN,
    listen: Sequence[str] = BOOTSTRAP_LOOPBACK,
) -> list[str]:
    """`p2ptrain bootstrap FLAGS` with the organiser's key (tmp/boot.key), listening on `listen`
    (loopback, any port; () for the defaults, as in a testbed's namespace)."""
    return [*cli, "bootstrap", "--identity", str(tmp / "boot.key"), *flags, *listen]


def join_argv(
    bootstrap: str,
    key: Path,
    *flags: str,
    token: str | None = None,
    control_only: bool = False,
    cli: Sequence[str] = P2PTRAIN,
    listen: Sequence[str] = JOIN_LOOPBACK,
) -> list[str]:
    """`p2ptrain join` to `bootstrap` as the identity in `key`, listening on `listen` (as in
    bootstrap_argv), holding `token` (a token, or a file of one; None: none), then `flags`
    (a worker's: --checkpoint-dir, --metrics-log; --quiet)."""
    return [
        *cli,
        "join",
        *(["--control-only"] if control_only else []),
        *listen,
        "--bootstrap",
        bootstrap,
        "--identity",
        str(key),
        *([] if token is None else ["--token", token]),
        *flags,
    ]


def start_node(
    reaper: ProcessReaper, argv: Sequence[str], log: Path, timeout_s: float = STARTUP_TIMEOUT_S
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a node's `argv` (its stderr to `log`) and wait for its first stdout line, its
    multiaddr (reaper.read_line reads the rest): the process and that line."""
    proc = reaper.start(argv, stderr_path=log)
    return proc, reaper.read_line(proc, timeout_s)


def start_bootstrap_with(
    reaper: ProcessReaper,
    tmp: Path,
    *flags: str,
    cli: Sequence[str] = P2PTRAIN,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> tuple[subprocess.Popen[bytes], str]:
    """A loopback bootstrap of `flags` (bootstrap_argv), its log tmp/boot.log: the process and
    its multiaddr."""
    return start_node(reaper, bootstrap_argv(tmp, *flags, cli=cli), tmp / "boot.log", timeout_s)


def start_bootstrap(
    reaper: ProcessReaper, tmp: Path, run_toml: str = CONTROL_RUN
) -> tuple[subprocess.Popen[bytes], str]:
    """A bootstrap of `run_toml`. By default control-only peers stand in for trainers: the
    worker health check, which would plan them out (they have no worker), is off in that run."""
    run = tmp / "control-run.toml"
    run.write_text(run_toml)
    return start_bootstrap_with(reaper, tmp, "--run", str(run))


def planner_token(tmp: Path, name: str, planner: bool = True, valid_s: float = 86_400) -> str:
    """The organiser's (the bootstrap's key's) planner token for peer `name` (its key
    tmp/NAME.key, created if missing), valid for `valid_s`: what `p2ptrain token issue --planner`
    prints (tests/integration/test_admission.py runs that CLI); `planner=False`: a member's token
    (it may train, not plan)."""
    peer = identity.peer_id_of(identity.load_or_create_identity(tmp / f"{name}.key"))
    organiser = identity.load_identity(tmp / "boot.key")
    return issue_token(organiser, peer, planner, time.time() + valid_s).encode()


def start_peer(
    reaper: ProcessReaper,
    tmp: Path,
    bootstrap: str,
    name: str,
    trainer: bool = False,
    planner: bool = True,
    cli: Sequence[str] = P2PTRAIN,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> tuple[subprocess.Popen[bytes], str]:
    """A loopback `join` node `name` (control-only, or with its worker if `trainer`), holding a
    planner token (`planner`) or a member's, its log tmp/NAME.log: the process and its
    multiaddr."""
    worker = ("--checkpoint-dir", str(tmp / name / "checkpoints")) if trainer else ()
    token = planner_token(tmp, name, planner)
    argv = join_argv(
        bootstrap, tmp / f"{name}.key", *worker, token=token, control_only=not trainer, cli=cli
    )
    return start_node(reaper, argv, tmp / f"{name}.log", timeout_s)


def control_join_argv(tmp: Path, bootstrap: str, name: str, planner: bool) -> list[str]:
    """`join --control-only` for peer `name`, holding the organiser's planner token (`planner`)
    or a member's."""
    token = planner_token(tmp, name, planner)
    return join_argv(bootstrap, tmp / f"{name}.key", token=token, control_only=True)


def peer_id(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


def get_status(addr: str) -> dict[str, Any] | None:
    """`p2ptrain status --json` as a user runs it; None if it failed."""
    try:
        out = subprocess.run(
            [*P2PTRAIN, "status", "--bootstrap", addr, "--json"],
            capture_output=True,
            timeout=30,
            cwd=REPO_ROOT,
            check=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    status: dict[str, Any] = json.loads(out.stdout)
    return status


class StatusWatch:
    """`p2ptrain status --watch S --json` as a user runs it: one observer process, its statuses
    read as they come. A `p2ptrain status` per look cost ~0.7 s of CPU each (imports, a key, a
    dial), taken from the 2 cores the swarm under test runs on: polled every 0.5 s through a
    failover, that was half a core."""

    def __init__(self, addr: str, interval_s: float) -> None:
        interval_s = max(interval_s, 0.2)  # status --watch's least
        argv = [*P2PTRAIN, "status", "--bootstrap", addr, "--json", "--watch", str(interval_s)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO_ROOT, text=True
        )
        self._statuses: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                with contextlib.suppress(ValueError):  # not a status: none to judge
                    self._statuses.put(json.loads(line))
        finally:
            self._statuses.put(None)  # the watch ended

    def next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next status, or None if none came within timeout_s (or the watch ended)."""
        try:
            return self._statuses.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None

    def __enter__(self) -> StatusWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for_status(
    addr: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout_s: float,
    interval_s: float = 1.0,
) -> tuple[dict[str, Any] | None, bool]:
    """Watch status until predicate holds; returns (last status, whether it held)."""
    deadline = time.monotonic() + timeout_s
    status = None
    with StatusWatch(addr, interval_s) as watch:
        while (got := watch.next(deadline - time.monotonic())) is not None:
            status = got
            if predicate(status):
                return status, True
    return status, False


def alive_ids(status: dict[str, Any]) -> set[str]:
    return {p["id"] for p in status["peers"] if p["alive"]}


def rtt_pairs(status: dict[str, Any], ids: set[str]) -> set[tuple[str, str]]:
    return {
        (link["a"], link["b"])
        for link in status["links"]
        if link["rtt_ms"] is not None and link["a"] in ids and link["b"] in ids
    }


def plan_peers(plan: dict[str, Any]) -> list[str]:
    return [p for pipeline in plan["pipelines"] for p in pipeline] + plan["spares"]


def log_tails(tmp: Path, names: Sequence[str], num_lines: int = 12) -> str:
    """The last lines of each named node's log (tmp/NAME.log): what a failed check shows."""
    tails = []
    for name in names:
        path = tmp / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        tails.append(f"--- {name}.log\n" + "\n".join(lines[-num_lines:]))
    return "\n".join(tails)
