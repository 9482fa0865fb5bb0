"""The data plane's p2pd runs with the worker's Go settings (worker/daemon_env.py): started the
way a worker starts it (`python -m p2ptrain.worker.daemon_check`, a real daemon on loopback),
its own environment holds GOGC off and the memory limit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from p2ptrain.worker.daemon_env import GO_RUNTIME

pytestmark = pytest.mark.integration


def test_the_started_daemon_runs_with_the_go_settings() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "p2ptrain.worker.daemon_check", "--listen", "/ip4/127.0.0.1/tcp/0"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    assert result["go_runtime"] == GO_RUNTIME
