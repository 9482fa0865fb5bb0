"""At 16 peers every peer's telemetry reaches every other peer: no isolated node."""

from __future__ import annotations

import time

import pytest

from p2ptrain.control.observer import get_statuses
from tests.control.swarm_helpers import peer_id, start_bootstrap, start_peer, wait_for_status

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NUM_PEERS = 16
FRESH_S = 60.0  # reach, not latency: a row up to the link-age limit counts (shared 2-core box)


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
