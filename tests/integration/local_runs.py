"""Helpers for the tests that drive `python -m p2ptrain local` (a whole swarm on this machine) as
a subprocess: start a run, watch its workdir, SIGKILL one of its peers, and read its summary."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import processes_with

LocalProc = subprocess.Popen[bytes]


def tiny_run_toml(run_id: str, *extra: str) -> str:
    """The run spec file of the tiny two-stage model the `local` tests train: `run_id`, then
    `extra` lines. Its shape is fixed (compute_aware = false): timing noise on a loaded box
    must not shrink the plan, which these tests are about (compute-aware shapes are tested in
    tests/schedule/test_compute_cost.py)."""
    lines = ["[run]", f'run_id = "{run_id}"', "compute_aware = false", "stages = 2", "n_layer = 2"]
    lines += ["n_head = 2", "n_embd = 32", "block_size = 16", "batch_size = 8", *extra]
    return "\n".join(lines) + "\n"


def tiny_swarm(tmp_path: Path, run_toml: str, peers: int, steps: int) -> tuple[list[str], Path]:
    """`local`'s arguments for `peers` nodes training `run_toml` (written into `tmp_path`) for
    `steps` steps in fp32 exchange, and the work directory they will use."""
    run = tmp_path / "run.toml"
    run.write_text(run_toml)
    workdir = tmp_path / "swarm"
    args = ["--peers", str(peers), "--run", str(run), "--steps", str(steps), "--no-compression"]
    return [*args, "--workdir", str(workdir)], workdir


def start_local(*args: str, module: str = "p2ptrain") -> LocalProc:
    """`python -m <module> local --json ARGS` in a session of its own (so that its whole group can
    be killed), stdout and stderr piped. `module` is another entry point with a `local` command
    (`p2ptrain.harness.with_faults` takes the `--fault` flags)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, "local", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def stop_local(proc: LocalProc) -> None:
    """SIGKILL the run's process group if it is still running, and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def local_run(*args: str, module: str = "p2ptrain") -> Iterator[LocalProc]:
    """`start_local(*args)`; whatever happens in the block, the run is stopped at its end."""
    proc = start_local(*args, module=module)
    try:
        yield proc
    finally:
        stop_local(proc)


def wait_local(proc: LocalProc, timeout_s: float) -> tuple[str, str]:
    """The run's (stdout, stderr) once it has exited; it is stopped if it outlives `timeout_s`
    (subprocess.TimeoutExpired)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        stop_local(proc)
    return out.decode(), err.decode()


def summary_of(proc: LocalProc, out: str, err: str) -> dict:
    """The JSON summary (the last stdout line) of a run that exited 0; the tail of its stderr if
    it did not."""
    assert proc.returncode == 0, err[-3000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def finish_local(proc: LocalProc, timeout_s: float) -> dict:
    """Wait for the run to end (at most `timeout_s`) and return its summary: it must exit 0."""
    return summary_of(proc, *wait_local(proc, timeout_s))


def run_local(*args: str, timeout_s: float = 240) -> dict:
    """A whole `local` run of `args`: its summary (it must exit 0 within `timeout_s`)."""
    with local_run(*args) as proc:
        return finish_local(proc, timeout_s)


def emulated(topology: Path, steps: int, workdir: Path, run: Path) -> tuple[str, ...]:
    """`local`'s arguments for `steps` steps of `run` in the WAN testbed of `topology` (a node
    in a network namespace of its own a peer; needs root)."""
    return (
        "--emulate",
        str(topology),
        "--steps",
        str(steps),
        "--workdir",
        str(workdir),
        "--run",
        str(run),
    )


def steps_reported(workdir: Path) -> int:
    """How many distinct steps the run's workers have reported in its metrics files."""
    done = set()
    for path in workdir.glob("metrics-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"metrics"' in line:
                done.add(json.loads(line)["step"])
    return len(done)


def wait_for_steps(proc: LocalProc, workdir: Path, steps: int, timeout_s: float) -> None:
    """Wait until `steps` steps are reported in workdir; fail if the run exits first or
    `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while (done := steps_reported(workdir)) < steps:
        assert proc.poll() is None, f"`local` exited ({proc.returncode}) after {done} steps"
        assert time.monotonic() < deadline, f"{done} of {steps} steps within {timeout_s} s"
        time.sleep(0.2)


def kill_peer(workdir: Path, peer: int) -> None:
    """SIGKILL peer `peer`'s join node and its whole tree (its process group: worker, daemons)."""
    victim = processes_with(str(workdir / f"peer-{peer}.key"))
    assert victim, f"peer {peer} is not running"
    os.killpg(os.getpgid(min(victim)), signal.SIGKILL)


def peer_logs(workdir: Path) -> str:
    """Every peer's log of the run, one after the other."""
    return "".join(p.read_text() for p in workdir.glob("peer-*.log"))
