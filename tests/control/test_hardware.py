"""The compute a peer announces: numpy's matmul throughput, measured in a child process."""

from __future__ import annotations

import sys

import pytest
import trio

from p2ptrain.control import hardware


def test_compute_is_measured_in_a_child_process() -> None:
    gflops = trio.run(hardware.measure_compute_gflops_in_child)
    assert gflops is not None and gflops > 0.1


def test_a_failed_child_gives_no_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert trio.run(hardware.measure_compute_gflops_in_child) is None


def test_the_hardware_description_is_plain_data() -> None:
    described = hardware.describe_hardware()
    assert described["cpu_count"] >= 1 and described["memory_bytes"] > 0
    assert isinstance(described["gpus"], list)
