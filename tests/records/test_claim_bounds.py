"""Issue 26.9: a peer's compute claim is bounded: no zero-time passes, no 8 PiB devices."""

from __future__ import annotations

import pytest

from p2ptrain.errors import WireError
from p2ptrain.records import PeerRecord, StageCompute
from p2ptrain.records.peer import MAX_DEVICE_MEMORY_BYTES

CLAIM = {
    "block_row_s": 4e-4,
    "embed_row_s": 2e-5,
    "head_row_s": 3e-4,
    "rows": 8,
    "device": "cuda",
    "run_id": "r",
    "memory_bytes": 80 * 2**30,
}


@pytest.mark.parametrize("name", ["block_row_s", "embed_row_s", "head_row_s"])
@pytest.mark.parametrize("value", [0, 0.0, 1e-12])
def test_a_pass_claimed_to_take_no_time_is_refused(name: str, value: float) -> None:
    with pytest.raises(WireError, match=name):
        StageCompute.from_dict({**CLAIM, name: value})
    record = {
        "addrs": [],
        "role": "trainer",
        "planner_capable": False,
        "version": "0",
        "hardware": {},
        "stage_compute": {**CLAIM, name: value},
    }
    with pytest.raises(WireError):
        PeerRecord.from_dict(record)


def test_memory_claims_count_for_at_most_4_tib() -> None:
    huge = StageCompute.from_dict({**CLAIM, "memory_bytes": 2**53})  # 8 PiB
    assert huge.memory_bytes == MAX_DEVICE_MEMORY_BYTES == 4 * 2**40
    honest = StageCompute.from_dict(CLAIM)
    assert honest.memory_bytes == 80 * 2**30 and honest.block_row_s == 4e-4
