"""Issue 29: 32 real control-only peers on loopback form a swarm and hold it: all alive, one
planner, a plan within 60 s of the last start; in steady state all 32 together use at most one
core on average over a minute, and at most 100 MB resident each (the peer's supervisor and
control process together, read from /proc).

Past FULL_MESH_PEERS (16) members each node measures a bounded neighbour set, not every member,
and gossips only those links (control/estimate/book.py): the swarm's probing and telemetry stay
O(N x neighbours), not O(N^2). As a community run is organised, a few peers hold planner tokens
(NUM_CANDIDATES) and the others members' tokens: a member's telemetry goes to the candidates and
the bootstrap only (control/gossip.py)."""

from __future__ import annotations

import datetime
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.harness.control_cpu import cpu_s
from tests.conftest import ProcessReaper, descendants_of
from tests.control.swarm_helpers import (
    P2PTRAIN,
    SOFT_NOFILE,
    STARTUP_TIMEOUT_S,
    alive_ids,
    control_join_argv,
    peer_id,
    plan_peers,
    start_bootstrap_with,
    wait_for_status,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_PEERS = 32
NUM_CANDIDATES = 3
PLAN_WITHIN_S = 60.0
# the plan stood this long: the starts' bursts, and the re-plans that follow a first plan made on
# estimated links (its confirmation, then drift re-plans on what was measured meanwhile, each with
# a confirmation round of probes: control/planning/confirm.py), came within ~55 s of each plan
SETTLE_S = 60.0
MAX_SETTLE_S = 240.0
MEASURE_S = 60.0
MAX_CORES = 1.0
MAX_RESIDENT_BYTES = 100 * 1024 * 1024
CLI = (*SOFT_NOFILE, *P2PTRAIN)
RUN = f"[run]\nworker_stall_s = 0.0\nmin_peers = {NUM_PEERS}\n"
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES
    except OSError:
        return 0


def proportional_bytes(pid: int) -> int:
    """The process's share of the memory it maps (PSS: a library page shared by the 33 nodes
    counts a 33rd to each)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return next(
        int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:")
    )


def tree(pid: int) -> list[int]:
    return [pid, *descendants_of(pid)]


def accepted_plans(log: Path, said: str = "accepted plan term ") -> list[float]:
    """When (time.time) the bootstrap accepted each plan (each whose log line holds `said`),
    from its log."""
    return [
        datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in log.read_text().splitlines()
        if said in line
    ]


def accepted_at(log: Path, plan: dict[str, Any]) -> float:
    """When (time.time) the bootstrap accepted `plan`, from its log."""
    said = f"accepted plan term {plan['term']} epoch {plan['epoch']} "
    stamps = accepted_plans(log, said)
    assert stamps, f"the bootstrap never logged {said!r}"
    return stamps[0]


def wait_for_plan_to_stand(log: Path, stood_s: float, timeout_s: float) -> int:
    """Wait until the bootstrap accepted no new plan for `stood_s` (at most `timeout_s`); the
    number of plans it accepted by then."""
    deadline = time.time() + timeout_s
    while True:
        plans = accepted_plans(log)
        if (plans and time.time() - plans[-1] >= stood_s) or time.time() >= deadline:
            return len(plans)
        time.sleep(1.0)


def one_plan_of_everyone(everyone: set[str]) -> Any:
    def check(status: dict[str, Any]) -> bool:
        plan = status.get("plan")
        return (
            alive_ids(status) >= everyone
            and status.get("planner") is not None
            and plan is not None
            and set(plan_peers(plan)) >= everyone
        )

    return check


@pytest.mark.timeout(1200)
def test_thirty_two_control_peers_plan_and_hold_within_one_core(
    reaper: ProcessReaper, tmp_path: Path
) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    boot, boot_addr = start_bootstrap_with(
        reaper, tmp_path, "--run", str(tmp_path / "run.toml"), cli=CLI
    )
    procs: list[subprocess.Popen[bytes]] = []
    for i in range(NUM_PEERS):
        name = f"peer{i}"
        argv = [*SOFT_NOFILE, *control_join_argv(tmp_path, boot_addr, name, i < NUM_CANDIDATES)]
        procs.append(reaper.start(argv, stderr_path=tmp_path / f"{name}.log"))
    everyone = {peer_id(reaper.read_line(p, STARTUP_TIMEOUT_S * 4)) for p in procs}
    started = time.time()

    # `status` itself takes seconds on a loaded machine: the plan's time is the bootstrap's
    # (its log says when it accepted each plan), the plan's content is what status shows
    status, ok = wait_for_status(boot_addr, one_plan_of_everyone(everyone), 4 * PLAN_WITHIN_S)
    assert ok, f"no plan of all {NUM_PEERS} (see {tmp_path}): {status}"
    assert status is not None
    planned_s = accepted_at(tmp_path / "boot.log", status["plan"]) - started
    print(f"\nplan of all {NUM_PEERS} peers {planned_s:.1f} s after the last one started")

    # the steady state: the plan's confirmation rounds (control/planning/confirm.py) are over;
    # measured (and reported) even if the plan was late or never stood still
    plans = wait_for_plan_to_stand(tmp_path / "boot.log", SETTLE_S, MAX_SETTLE_S)
    print(f"{plans} plan(s) accepted by the bootstrap before the steady state")
    pids = [pid for proc in (boot, *procs) for pid in tree(proc.pid)]
    before = {pid: cpu_s(pid) for pid in pids}
    measured_at = time.monotonic()
    time.sleep(MEASURE_S)
    elapsed = time.monotonic() - measured_at
    cores = sum(cpu_s(pid) - before[pid] for pid in pids) / elapsed
    replans = len(accepted_plans(tmp_path / "boot.log")) - plans
    resident = {proc.pid: sum(resident_bytes(pid) for pid in tree(proc.pid)) for proc in procs}
    shares = {proc.pid: sum(proportional_bytes(pid) for pid in tree(proc.pid)) for proc in procs}
    largest = max(resident.values())
    print(
        f"steady state over {elapsed:.0f} s: {cores:.2f} cores for the swarm "
        f"({NUM_PEERS} peers + bootstrap); per peer (supervisor + control) resident "
        f"{min(resident.values()) / 2**20:.0f}-{largest / 2**20:.0f} MiB, proportional "
        f"{min(shares.values()) / 2**20:.0f}-{max(shares.values()) / 2**20:.0f} MiB; "
        f"{replans} plan(s) accepted meanwhile"
    )

    status, ok = wait_for_status(boot_addr, one_plan_of_everyone(everyone), 30)
    assert ok, f"the swarm did not hold (see {tmp_path}): {status}"
    assert status is not None
    assert len({p["id"] for p in status["peers"] if p["planner"]}) == 1
    assert planned_s <= PLAN_WITHIN_S
    assert cores <= MAX_CORES, f"{cores:.2f} cores in steady state"
    assert largest <= MAX_RESIDENT_BYTES, f"a peer holds {largest / 2**20:.0f} MiB"
    # each node measured its neighbour set, not every member: some links are never measured
    measured = [link for link in status["links"] if not link.get("estimated", False)]
    assert len(measured) < NUM_PEERS * (NUM_PEERS - 1) // 2
