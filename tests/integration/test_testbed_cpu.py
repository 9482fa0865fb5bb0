"""Slow peers: a CPU quota on a testbed peer (or on its compute only) makes a fixed CPU loop run
about that much slower, children included (root; cgroup cpu controller)."""

from __future__ import annotations

import json
import os
import statistics
import sys

import pytest

from p2ptrain.testbed import LinkSpec, Testbed
from p2ptrain.testbed.cpu import cpu_root
from p2ptrain.testbed.netns import list_netns

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, cgroups)"),
]

# a fixed amount of CPU work, run in a child process (the quota must cover what a peer starts)
LOOP = (
    "import subprocess, sys, time; t = time.monotonic(); "
    "subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(3_000_000))'], check=True); "
    "print(time.monotonic() - t)"
)


# what a worker reports to the planner (worker/compute_probe.py), timed inside the peer
PROBE = (
    "from p2ptrain.records import RunSpec; "
    "from p2ptrain.worker.compute_probe import measure_stage_compute; "
    "print(measure_stage_compute(RunSpec()).block_row_s)"
)


def _timed_s(bed: Testbed, peer: int, code: str) -> float:
    """Run `code` in the peer's namespace (and cgroup); the number it prints."""
    done = bed.run(peer, [sys.executable, "-c", code], timeout_s=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip())


def _held_s(bed: Testbed, peer: int, code: str) -> float:
    """`code`'s typical time under a quota: the median of three. Now and then a held run gets
    well over its share (CFS hands the quota out in per-CPU slices: likely leftovers on both
    cores): in one CI run a held loop took 0.54 s where its mates take 0.74-0.98 s and the
    unlimited one 0.22 s, and the fastest of two judged the quota by that lucky run."""
    return statistics.median(_timed_s(bed, peer, code) for _ in range(3))


def _quarter_core_bed() -> Testbed:
    """Two peers on a fast link, peer 1 under a quarter-core quota."""
    try:
        cpu_root()
    except Exception:
        pytest.skip("no cgroup cpu controller")
    link = LinkSpec(delay_ms=1.0, rate_mbps=100.0)
    return Testbed({(0, 1): link, (1, 0): link}, cpu_cores={1: 0.25})


def test_a_quarter_core_runs_a_cpu_loop_about_four_times_slower() -> None:
    with _quarter_core_bed() as bed:
        assert json.loads(bed.state_path.read_text())["cgroups"] == bed.cgroups
        fast = min(_timed_s(bed, 0, LOOP) for _ in range(2))
        slow = _held_s(bed, 1, LOOP)
        bed.set_cpu(1, None)  # lifted at runtime
        lifted = min(_timed_s(bed, 1, LOOP) for _ in range(2))
        groups = list(bed.cgroups)
    # 4x by the quota; the bounds leave room for the other load on a busy machine
    assert slow / fast > 2.5, (fast, slow)
    assert slow / lifted > 2.5, (lifted, slow)
    assert not any(os.path.exists(g) for g in groups)
    assert not [ns for ns in list_netns() if ns.startswith(f"p2tb{bed.id}")]


@pytest.mark.slow  # ~40 s (CI time); the quota itself is tested below
def test_the_compute_probe_sees_a_peers_cpu_quota() -> None:
    # the probe's window spans several 100 ms quota periods: a short pass would run at full
    # speed inside its period's budget and call a throttled peer fast
    with _quarter_core_bed() as bed:
        fast = min(_timed_s(bed, 0, PROBE) for _ in range(2))
        slow = _held_s(bed, 1, PROBE)
    assert slow / fast > 2.5, (fast, slow)


def _loop_named(marker: str) -> str:
    """LOOP with a longer child whose command line carries `marker`."""
    child = f"[sys.executable, '-c', 'sum(i * i for i in range(10_000_000))', '{marker}']"
    return (
        "import subprocess, sys, time; t = time.monotonic(); "
        f"subprocess.run({child}, check=True); print(time.monotonic() - t)"
    )


def test_a_compute_quota_holds_back_only_the_processes_that_name_the_compute() -> None:
    # a slow GPU, not a slow network stack: the peer's other processes keep their speed
    try:
        cpu_root()
    except Exception:
        pytest.skip("no cgroup cpu controller")
    link = LinkSpec(delay_ms=1.0, rate_mbps=100.0)
    marker = "p2tb-test-compute"
    bed = Testbed({(0, 1): link, (1, 0): link}, compute_cores={1: 0.25}, compute_match=(marker,))
    where = "import time; time.sleep(0.5); print(open('/proc/self/cgroup').read())"
    with bed:
        other = min(_timed_s(bed, 1, _loop_named("other")) for _ in range(2))
        compute = _held_s(bed, 1, _loop_named(marker))
        moved = bed.run(1, [sys.executable, "-c", where, marker], timeout_s=30).stdout
        stayed = bed.run(1, [sys.executable, "-c", where, "other"], timeout_s=30).stdout
        groups = [*bed.cgroups, *bed.compute_groups]
    assert f"{bed.namespaces[1]}-compute" in moved and "-compute" not in stayed
    # 4x by the quota, less the moments before the mover's next pass and the machine's other
    # load (which slows the unlimited loop, not the held one)
    assert compute / other > 2.0, (other, compute)
    assert not any(os.path.exists(g) for g in groups)
