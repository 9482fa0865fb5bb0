"""The worker's process-tree CPU clock (worker/cpu_clock.py) counts its children's work too."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from p2ptrain.worker.cpu_clock import TreeCpuClock


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_clock_counts_a_childs_cpu_and_not_its_sleep() -> None:
    clock = TreeCpuClock()
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(5)"])
    try:
        time.sleep(0.05)  # the child exists: the tree is found with it in
        before = clock.seconds()
        time.sleep(1.5)  # the child burns 0.4 s of CPU (plus its start), then sleeps
        spent = clock.seconds() - before
        assert 0.25 < spent < 1.2, spent
        idle = clock.seconds()
        time.sleep(0.3)
        assert clock.seconds() - idle < 0.1  # sleeping costs nothing
    finally:
        child.kill()
        child.wait()
    assert clock.seconds() >= 0  # the child gone: the tree is found again, without it
