"""Helpers for control-plane integration tests: start a bootstrap and peers, poll status."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2ptrain import identity
from p2ptrain.records import issue_token
from tests.conftest import PYTHON, REPO_ROOT, ProcessReaper

STARTUP_TIMEOUT_S = 60.0
# many nodes on one machine: loopback, any port (the defaults are fixed ports on every interface)
BOOTSTRAP_LOOPBACK = ("--listen", "/ip4/127.0.0.1/tcp/0")
JOIN_LOOPBACK = (*BOOTSTRAP_LOOPBACK, "--data-listen", "/ip4/127.0.0.1/tcp/0")


def start_bootstrap(
    reaper: ProcessReaper, tmp: Path, run_toml: str = "[run]\nworker_stall_s = 0.0\n"
) -> tuple[subprocess.Popen[bytes], str]:
    """A bootstrap of `run_toml`. By default control-only peers stand in for trainers: the
    worker health check, which would plan them out (they have no worker), is off in that run."""
    run = tmp / "control-run.toml"
    run.write_text(run_toml)
    proc = reaper.start(
        [
            PYTHON,
            "-m",
            "p2ptrain",
            "bootstrap",
            "--identity",
            str(tmp / "boot.key"),
            "--run",
            str(run),
            *BOOTSTRAP_LOOPBACK,
        ],
        stderr_path=tmp / "boot.log",
    )
    return proc, reaper.read_line(proc, STARTUP_TIMEOUT_S)


def planner_token(tmp: Path, name: str, planner: bool = True) -> str:
    """The organiser's (the bootstrap's key's) planner token for peer `name`: what
    `p2ptrain token issue --planner` prints (tests/integration/test_admission.py runs that CLI);
    `planner=False`: a member's token (it may train, not plan)."""
    peer = identity.peer_id_of(identity.load_or_create_identity(tmp / f"{name}.key"))
    organiser = identity.load_identity(tmp / "boot.key")
    return issue_token(organiser, peer, planner, time.time() + 86_400).encode()


def start_peer(
    reaper: ProcessReaper, tmp: Path, bootstrap: str, name: str, trainer: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """A `join` node (control-only, or with its worker if `trainer`) and its multiaddr (its
    first stdout line; reaper.read_line reads the rest)."""
    worker = (
        ["--checkpoint-dir", str(tmp / name / "checkpoints")] if trainer else ["--control-only"]
    )
    proc = reaper.start(
        [
            PYTHON,
            "-m",
            "p2ptrain",
            "join",
            *worker,
            *JOIN_LOOPBACK,
            "--bootstrap",
            bootstrap,
            "--identity",
            str(tmp / f"{name}.key"),
            "--token",
            planner_token(tmp, name),
        ],
        stderr_path=tmp / f"{name}.log",
    )
    return proc, reaper.read_line(proc, STARTUP_TIMEOUT_S)


def control_join_argv(tmp: Path, bootstrap: str, name: str, planner: bool) -> list[str]:
    """`join --control-only` for peer `name`, holding the organiser's planner token (`planner`)
    or a member's."""
    return [
        PYTHON,
        "-m",
        "p2ptrain",
        "join",
        "--control-only",
        *JOIN_LOOPBACK,
        "--bootstrap",
        bootstrap,
        "--identity",
        str(tmp / f"{name}.key"),
        "--token",
        planner_token(tmp, name, planner),
    ]


def peer_id(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


def get_status(addr: str) -> dict[str, Any] | None:
    """`p2ptrain status --json` as a user runs it; None if it failed."""
    try:
        out = subprocess.run(
            [PYTHON, "-m", "p2ptrain", "status", "--bootstrap", addr, "--json"],
            capture_output=True,
            timeout=30,
            cwd=REPO_ROOT,
            check=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def wait_for_status(
    addr: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout_s: float,
    interval_s: float = 1.0,
) -> tuple[dict[str, Any] | None, bool]:
    """Poll status until predicate holds; returns (last status, whether it held)."""
    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        status = get_status(addr)
        if status is not None and predicate(status):
            return status, True
        time.sleep(interval_s)
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
