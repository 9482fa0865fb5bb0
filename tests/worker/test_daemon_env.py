"""The data plane's p2pd runs with the worker's Go settings (worker/daemon_env.py): started the
way a worker starts it (`python -m p2ptrain.worker.daemon_check`, a real daemon on loopback, as
`p2ptrain doctor` runs it), its own environment holds GOGC off and the memory limit, and the
doctor's line says so; the same child says where `--device` would train."""

from __future__ import annotations

import pytest

from p2ptrain.node.doctor import finish_daemon_check, start_daemon_check

pytestmark = pytest.mark.integration


def test_the_started_daemon_runs_with_the_go_settings() -> None:
    check, device = finish_daemon_check(start_daemon_check("/ip4/127.0.0.1/tcp/0", "cpu"))
    assert check.status == "ok", check
    assert "GOGC=off" in check.text and "GOMEMLIMIT=256MiB" in check.text, check.text
    # and where the stage would train (the doctor's device line)
    assert device is not None and device.name == "cpu", device
    assert device.precision == device.precision_scaled == "fp32"
    assert device.memory_bytes > 2**28
