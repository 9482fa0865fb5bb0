"""Who gets a stage state (worker/resume/state_transfer.py, docs/security.md 26.12), with real p2pd
streams on 127.0.0.1 (in a subprocess: hivemind is not imported beside libp2p): only peers of
the current or previous plan, at most MAX_SERVING_PER_PEER at once per peer and MAX_SERVING in
all (past that: BUSY, nothing sent, and the client retries), and never a pickled state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROBE = Path(__file__).with_name("state_server_probe.py")


def test_stage_states_go_only_to_the_plans_peers_within_the_caps(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(PROBE), str(tmp_path)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["per_peer"] == 2 and result["in_all"] == 4
    # a stranger that knows the digest is told nothing: a token run's weights do not leak
    assert result["stranger"] == ["missing"] * 3
    # two idle requests of one member are held, its third is busy at once; a second member
    # fills the server (4 in all) and a third member, under its own cap, is busy too
    assert result["m1_idle"] == ["held", "held", "busy"]
    assert result["m2_idle"] == ["held", "held"]
    assert result["m3_when_full"] == "busy"
    assert result["refused"] == 3 + 1 + 1
    # with the slots free, a member gets the state; a state in the pickled format is not served
    assert result["m3_fetch"] == result["digest"]
    assert result["m3_fetch_pickled"].startswith("FileNotFoundError")
    # a member told busy retries until a slot is free (freed after 2 s)
    assert result["m1_fetch_after_busy"] == result["digest"]
    assert result["m1_fetch_after_busy_s"] >= 1.5
    # a member's word that it holds the state counts as fetched (a donor stops waiting for
    # it); a stranger's does not
    assert result["m2_told"] is True and result["stranger_told"] is False
    # the previous plan's peers are still served (they may be fetching), not those before
    assert result["m1_previous_plan"] == result["digest"]
    assert result["m1_two_plans_ago"].startswith("FileNotFoundError")
    assert result["m2_current_plan"] == result["digest"]
