"""At 16 peers every peer's telemetry reaches every other peer: no isolated node. Two training
`join` nodes print a line per step, and `status` shows each one's progress, data-plane bytes
and the rates measured on their link."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import pytest

from p2ptrain.control.observer import get_statuses
from tests.conftest import processes_with
from tests.control.swarm_helpers import peer_id, start_bootstrap, start_peer, wait_for_status

pytestmark = pytest.mark.integration
NUM_PEERS = 16
FRESH_S = 60.0  # reach, not latency: a row up to the link-age limit counts (shared 2-core box)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_telemetry_reaches_every_peer_at_16(tmp_path, reaper):
    _, boot_addr = start_bootstrap(reaper, tmp_path)
    addrs = [start_peer(reaper, tmp_path, boot_addr, f"peer{i}")[1] for i in range(NUM_PEERS)]
    ids = {peer_id(a) for a in addrs}
    # reach: every (receiver, author) pair must be seen fresh at least once within the window
    deadline = time.monotonic() + 120
    missing = {peer_id(a): ids - {peer_id(a)} for a in addrs}
    while missing and time.monotonic() < deadline:
        for addr, status in zip(addrs, get_statuses(addrs), strict=True):
            if status is not None:
                heard = {a for a, age in status.telemetry_age_s.items() if age < FRESH_S}
                missing[peer_id(addr)] = missing.get(peer_id(addr), set()) - heard
        missing = {k: v for k, v in missing.items() if v}
        time.sleep(2)
    assert not missing, {k[-6:]: sorted(v_[-6:] for v_ in v) for k, v in missing.items()}
    # the bootstrap sees the whole swarm too, with most of the RTT matrix (one probe per second
    # per peer, to its stalest link: a full round takes ~N/2 s on an idle machine)
    num_pairs = NUM_PEERS * (NUM_PEERS - 1) // 2

    def covered(status: dict) -> bool:
        num_rtts = sum(1 for link in status["links"] if link["rtt_ms"] is not None)
        alive = {p["id"] for p in status["peers"] if p["alive"]}
        return alive == ids and num_rtts >= 0.9 * num_pairs

    status, ok = wait_for_status(boot_addr, covered, timeout_s=60, interval_s=3)
    assert ok, status


# a tiny model trained for longer than the test looks: the nodes are still training when it asks
TRAIN_RUN = """
[run]
run_id = "progress-test"
min_peers = 2
stages = 2
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
steps = 100000
"""
WAIT_LINE = re.compile(r"waiting for |placed in the plan: training$")
PROGRESS_LINE = re.compile(
    r"step \d+  loss (-|\d+\.\d{3})  \d+ tok/s  avg .+  plan t\d+/e\d+ stage \d replica \d  "
    r"sent \d+(\.\d)? k?M?G?B  recv \d+(\.\d)? k?M?G?B"
    r"(  (resumed|started) .+)?"  # a session's first line: where it started (issue 30)
)


@pytest.mark.timeout(300)
def test_join_prints_its_steps_and_status_shows_progress_bytes_and_rates(tmp_path, reaper):
    _, boot_addr = start_bootstrap(reaper, tmp_path, TRAIN_RUN)
    nodes = [start_peer(reaper, tmp_path, boot_addr, f"trainer{i}", trainer=True) for i in (0, 1)]
    ids = {peer_id(addr) for _, addr in nodes}

    def progressed(status: dict[str, Any]) -> bool:
        metrics = [p["metrics"] for p in status["peers"] if p["id"] in ids and p["metrics"]]
        measured = [
            link
            for link in status["links"]
            if {link["a"], link["b"]} == ids
            and link["rtt_ms"] is not None
            and link["bandwidth_mbps"]
        ]
        return (
            bool(measured)
            and len(metrics) == 2
            and all(
                m["step"] >= 2
                and m["tokens_per_s"] > 0
                and m["bytes_sent"] > 0
                and m["bytes_received"] > 0
                for m in metrics
            )
        )

    status, ok = wait_for_status(boot_addr, progressed, timeout_s=200, interval_s=3)
    assert ok, status
    # one pipeline of two stages: the last one reports the loss
    assert [p["metrics"]["loss"] is None for p in status["peers"] if p["id"] in ids].count(False)
    # after its multiaddr (read by start_peer), each node prints a line per step, after what
    # it waited for before its first plan (control/run_watch.py)
    for proc, _ in nodes:
        lines: list[str] = []
        while len(lines) < 3:
            line = reaper.read_line(proc, 30)
            if not WAIT_LINE.match(line):
                lines.append(line)
        assert all(PROGRESS_LINE.fullmatch(line) for line in lines), lines
    # a graceful stop (the supervisor stops its worker's whole group): the reaper's quicker
    # SIGKILL would leave a worker retrying its sends for a minute once its p2pd is gone
    for proc, _ in nodes:
        proc.send_signal(signal.SIGTERM)
    for proc, _ in nodes:
        proc.wait(timeout=60)
    assert not processes_with(str(tmp_path / "trainer")), "a process of a node is left"
