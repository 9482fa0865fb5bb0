"""Who gets a stage state (worker/resume/state_transfer.py, docs/security.md 26.12), with real p2pd
streams on 127.0.0.1 (in a subprocess: hivemind is not imported beside libp2p): only peers of
the current or previous plan, at most MAX_PENDING_PER_PEER streams of a peer waiting for their
request (past that: BUSY, nothing read, and the client retries), idle streams never in the way
of a request, one full send of a state to a peer a plan, and never a pickled state."""

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
    assert result["per_peer"] == 2
    # a stranger that knows the digest is told nothing: a token run's weights do not leak
    assert result["stranger"] == ["missing"] * 3
    # two idle streams of one member are held, its third is busy at once; two more of a second
    # member (4 in all, which took every serving slot once) do not make a third member busy
    assert result["m1_idle"] == ["held", "held", "busy"]
    assert result["m2_idle"] == ["held", "held"]
    assert result["m3_fetch"] == result["digest"]
    assert result["refused"] == 3 + 1
    # a second full download of that state under the same plan is served (a client may lose
    # what it read: at most MAX_SENDS a plan); a state in the pickled format is not served
    assert result["m3_fetch_again"] == result["digest"]
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
