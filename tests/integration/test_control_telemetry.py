"""At 16 peers every peer's telemetry reaches every other peer: no isolated node."""

from __future__ import annotations

import time

import pytest

from p2ptrain.control.observer import get_statuses
from tests.control.swarm_helpers import get_status, peer_id, start_bootstrap, start_peer

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
    # the bootstrap sees the whole swarm too, with a full RTT matrix
    status = get_status(boot_addr)
    assert status is not None
    assert {p["id"] for p in status["peers"] if p["alive"]} == ids
    num_rtts = sum(1 for link in status["links"] if link["rtt_ms"] is not None)
    assert num_rtts == NUM_PEERS * (NUM_PEERS - 1) // 2
