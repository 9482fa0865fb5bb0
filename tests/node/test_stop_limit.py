"""The supervisor bounds a stopping control process by the hand-over's limit the control process
wrote beside the IPC socket (control/handover.py: it grows with the stage's size), never below
the fixed limit nor past an hour, plus the stop's grace; a missing or garbled file is the fixed
limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.control.settings import HANDOVER_LIMIT_S, MAX_HANDOVER_S
from p2ptrain.node.supervisor import STOP_GRACE_S, _limit


@pytest.mark.parametrize(
    "written,limit",
    [
        (None, HANDOVER_LIMIT_S),
        ("600.0", 600.0),
        ("10", HANDOVER_LIMIT_S),
        ("1e9", MAX_HANDOVER_S),
        ("nan", HANDOVER_LIMIT_S),
        ("inf", MAX_HANDOVER_S),
        ("six hundred", HANDOVER_LIMIT_S),
    ],
)
def test_the_limit_is_the_control_process_s_within_bounds(
    tmp_path: Path, written: str | None, limit: float
) -> None:
    path = tmp_path / "handover-limit"
    if written is not None:
        path.write_text(written)
    assert _limit(path) == limit + STOP_GRACE_S
