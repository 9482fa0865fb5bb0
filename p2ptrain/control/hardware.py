"""What a peer announces about its machine: CPU, GPU, memory and a measured compute throughput.

The throughput is numpy's, measured in a child process (`python -m p2ptrain.control.hardware`)
that prints it and exits: numpy's ~11 MiB stay out of a control process that needs it for
nothing else unless it plans (control/planning/) or serves a large swarm's estimated links.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from p2ptrain.flags import python_module

log = logging.getLogger(__name__)

BENCH_MATRIX_SIZE = 256
BENCH_DURATION_S = 0.2
CHILD_TIMEOUT_S = 60.0  # a child's start on a machine busy starting a swarm takes seconds


def describe_hardware() -> dict[str, Any]:
    """CPU model and count, total memory, NVIDIA GPU models (read from /proc, no subprocess)."""
    return {
        "cpu_count": os.cpu_count() or 1,
        "cpu_model": _cpu_model(),
        "memory_bytes": _total_memory_bytes(),
        "gpus": _nvidia_gpus(),
        "machine": platform.machine(),
    }


async def measure_compute_gflops_in_child() -> float | None:
    """measure_compute_gflops() in a child process; None if it failed or took too long."""
    command = python_module("p2ptrain.control.hardware")
    try:
        with trio.fail_after(CHILD_TIMEOUT_S):
            # no parent-death signal: trio forks it on a worker thread, which exits when idle
            # (the signal would kill the measurement); it ends on its own within CHILD_TIMEOUT_S
            done = await trio.run_process(command, capture_stdout=True, stderr=subprocess.DEVNULL)
        gflops = float(done.stdout)
    except (OSError, ValueError, subprocess.CalledProcessError, trio.TooSlowError) as exc:
        log.warning("could not measure this machine's compute: %r", exc)
        return None
    return gflops if gflops > 0 else None


def measure_compute_gflops() -> float:
    """float32 matmul throughput of this process, measured for ~0.2 s (blocking)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((BENCH_MATRIX_SIZE, BENCH_MATRIX_SIZE), dtype=np.float32)
    b = rng.standard_normal((BENCH_MATRIX_SIZE, BENCH_MATRIX_SIZE), dtype=np.float32)
    num_runs = 0
    start = time.perf_counter()
    while (elapsed_s := time.perf_counter() - start) < BENCH_DURATION_S:
        a @ b
        num_runs += 1
    return round(2 * BENCH_MATRIX_SIZE**3 * num_runs / elapsed_s / 1e9, 2)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()[:80]
    except OSError:
        pass
    return platform.processor()[:80] or "unknown"


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def _nvidia_gpus() -> list[str]:
    models = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip()[:80])
        except OSError:
            continue
    return models[:16]


if __name__ == "__main__":
    print(measure_compute_gflops())
