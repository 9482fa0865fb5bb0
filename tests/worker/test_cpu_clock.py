"""The worker's process-tree CPU clock (worker/cpu_clock.py, on psutil) counts its children's
work too."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from p2ptrain.worker.cpu_clock import TreeCpuClock, WireMarks, round_cpu_split


def test_the_clock_counts_a_childs_cpu_and_not_its_sleep() -> None:
    clock = TreeCpuClock()
    burn = (
        "import sys, time\nprint('ready', flush=True)\nsys.stdin.readline()\n"
        "end = time.process_time() + 0.4\n"
        "while time.process_time() < end: pass\nprint('burnt', flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", burn + "time.sleep(30)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdout.readline()  # the child exists (and has not burnt yet): the tree has it
        before = clock.split()
        child.stdin.write(b"go\n")
        child.stdin.flush()
        child.stdout.readline()  # the child burnt 0.4 s of CPU (however loaded the box), and sleeps
        after = clock.split()
        spent = after.total - before.total
        assert 0.25 < spent < 1.2, spent
        # a child other than the daemon is a helper; this process sleeps
        assert after.helpers - before.helpers == pytest.approx(spent, abs=0.05)
        idle = clock.seconds()
        time.sleep(0.3)
        last = clock.seconds()
        assert last - idle < 0.1  # sleeping costs nothing
    finally:
        child.kill()
        child.wait()
    # the child gone: what it spent stays counted (a round's CPU never comes out negative),
    # and the tree is found again, without it
    assert clock.seconds() >= last
    assert clock.split().helpers >= after.helpers


def test_a_rounds_cpu_splits_at_its_first_part_out_and_its_last_part_in() -> None:
    # the clock read 10.0 at the round's start, 10.5 at its end; first part out at 10.1, last
    # part in at 10.4: 0.1 before the wire, 0.1 after, 0.3 beside it
    assert round_cpu_split(10.0, 10.5, (10.1, 10.4)) == pytest.approx((0.1, 0.1))
    assert round_cpu_split(10.0, 10.5, None) == (None, None)
    # marks outside the round (clocks read in two processes, a late mark) stay within it
    before, after = round_cpu_split(10.0, 10.5, (9.9, 10.6))
    assert (before, after) == (0.0, 0.0)
    before, after = round_cpu_split(10.0, 10.5, (10.7, 10.2))
    assert before == pytest.approx(0.5) and after == pytest.approx(0.0)


def test_wire_marks_go_to_the_worker_once_a_round_moved_parts_both_ways() -> None:
    marks = WireMarks(os.getpid())
    marks.start()
    marks.mark(100, 0)  # sent only: no round to report
    marks.finish()
    assert marks.last() is None
    for _ in range(2):
        marks.start()
        marks.mark(100, 0)
        burn = time.process_time() + 0.05
        while time.process_time() < burn:
            pass
        marks.mark(0, 100)
        marks.mark(50, 0)  # a later send (a reducer's reply) does not move the first mark
        marks.finish()
    first_sent, last_received = marks.last() or (0.0, 0.0)  # the newer of the two rounds
    assert 0 < first_sent <= last_received
    assert marks.last() is None  # read once


def test_a_clock_of_a_process_that_is_gone_reads_zero() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    clock = TreeCpuClock(child.pid)
    assert not clock.available and clock.split() == (0.0, 0.0)
