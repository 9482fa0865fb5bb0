"""`p2ptrain doctor` and published reachability on loopback (no root): a live bootstrap and one
`join --control-only` node, then doctor against it, and against a bootstrap that is not there.
The NAT cases are tests/integration/test_reachability_testbed.py's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, REPO_ROOT, ProcessReaper
from tests.control.swarm_helpers import peer_id, start_bootstrap, start_peer, wait_for_status

pytestmark = pytest.mark.integration

LOOPBACK_FLAGS = ["--listen", "/ip4/127.0.0.1/tcp/0", "--data-listen", "/ip4/127.0.0.1/tcp/0"]
ABSENT = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWEpFEHmEqrt8LqfEwjfnuGADJKacGeSiFb4M97xy61y2o"


def doctor(bootstrap: str, *flags: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [PYTHON, "-m", "p2ptrain", "doctor", "--bootstrap", bootstrap, "--json", *flags],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO_ROOT,
        check=False,
    )
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["status"] for check in report["checks"]}


def test_a_node_publishes_public_and_doctor_says_joining_works(
    tmp_path: Path, reaper: ProcessReaper
) -> None:
    _, bootstrap = start_bootstrap(reaper, tmp_path)
    _, addr = start_peer(reaper, tmp_path, bootstrap, "a")
    status, ok = wait_for_status(
        bootstrap,
        lambda s: [p["reachability"] for p in s["peers"]] == ["public"],
        timeout_s=30,
    )
    assert ok, status
    assert status is not None and status["peers"][0]["id"] == peer_id(addr)
    code, report, text = doctor(bootstrap, *LOOPBACK_FLAGS, "--control-only")
    assert code == 0, text
    assert report["reachability"] == "public" and report["nat"] == "none"
    assert statuses(report) == {
        "bootstrap": "ok",
        "reachability": "ok",
        "nat": "ok",
        "ports": "ok",
        "daemon": "skip",
        "device": "skip",
        "clock": "ok",
        "bandwidth": "ok",
    }, text
    assert "dialled back at /ip4/127.0.0.1/tcp/" in text and "by 2 peer(s)" in text
    assert text.splitlines()[-2] == "joining will work"


def test_an_absent_bootstrap_fails_with_a_fix_and_skips_the_rest() -> None:
    code, report, text = doctor(ABSENT, *LOOPBACK_FLAGS, "--control-only")
    assert code == 1 and not report["ok"]
    assert statuses(report) == {
        "bootstrap": "FAIL",
        "reachability": "skip",
        "nat": "skip",
        "ports": "ok",
        "daemon": "skip",
        "device": "skip",
        "clock": "skip",
        "bandwidth": "skip",
    }
    assert text.startswith("FAIL bootstrap does not answer at " + ABSENT)
    assert " — fix: check the address" in text.splitlines()[0]
    assert "joining will not work: bootstrap" in text
