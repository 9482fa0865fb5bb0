"""At 16 peers every peer's telemetry reaches every other peer: no isolated node."""

from __future__ import annotations

import time

import pytest

from p2ptrain.control.observer import get_statuses
from tests.control.swarm_helpers import peer_id, start_bootstrap, start_peer, wait_for_status

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NUM_PEERS = 16
FRESH_S = 10.0


@pytest.mark.timeout(300)
def test_telemetry_reaches_every_peer_at_16(tmp_path, reaper):
    _, boot_addr = start_bootstrap(reaper, tmp_path)
    addrs = [start_peer(reaper, tmp_path, boot_addr, f"peer{i}")[1] for i in range(NUM_PEERS)]
    ids = {peer_id(a) for a in addrs}
    deadline = time.monotonic() + 120
    missing: dict[str, set[str]] = {}
    while time.monotonic() < deadline:
        missing = {}
        for addr, status in zip(addrs, get_statuses(addrs), strict=True):
            heard = (
                set()
                if status is None
                else {author for author, age in status["telemetry_age_s"].items() if age < FRESH_S}
            )
            lacking = ids - {peer_id(addr)} - heard
            if lacking:
                missing[peer_id(addr)] = lacking
        if not missing:
            break
        time.sleep(2)
    assert not missing, {k[-6:]: sorted(v_[-6:] for v_ in v) for k, v in missing.items()}
    # the bootstrap sees the whole swarm too, and soon a full RTT matrix (one probe per second
    # per peer, to its stalest link: a full round takes ~N/2 s)

    def complete(status: dict) -> bool:
        num_rtts = sum(1 for link in status["links"] if link["rtt_ms"] is not None)
        alive = {p["id"] for p in status["peers"] if p["alive"]}
        return alive == ids and num_rtts == NUM_PEERS * (NUM_PEERS - 1) // 2

    status, ok = wait_for_status(boot_addr, complete, timeout_s=60, interval_s=3)
    assert ok, status
