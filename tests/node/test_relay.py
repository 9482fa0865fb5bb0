"""The supervisor relays the control process's stdout: once its own stdout is gone (`join | head
-1`), it keeps reading and drops the lines, so that the control process never blocks on a full
pipe."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from p2ptrain.node.stdout_relay import StdoutRelay, relay_lines

# a control process's address, then far more progress than a pipe holds (64 KiB)
PRINTER = "print('/ip4/127.0.0.1/tcp/1', flush=True)\nfor i in range(20000): print('x' * 40, i)"


def test_a_closed_stdout_does_not_stop_the_relay_nor_block_the_child() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone: every write is a broken pipe
    out = open(write_end, "w")  # noqa: SIM115
    child = subprocess.Popen([sys.executable, "-c", PRINTER], stdout=subprocess.PIPE)
    assert child.stdout is not None
    lines = []
    try:
        relay_lines(child.stdout, out, True, lambda: lines.append(1))
        assert child.wait(timeout=30) == 0  # it printed everything: nothing blocked it
    finally:
        child.kill()
        child.wait()
    assert len(lines) == 20001  # every line was read, the first one (the address) too
    assert os.readlink(f"/proc/self/fd/{out.fileno()}") == os.devnull  # no error at exit
    out.write("more\n")
    out.close()  # the flush of what the failed write left: no error either


def test_lines_reach_stdout_and_a_restarted_control_process_address_goes_to_the_log() -> None:
    out = io.StringIO()
    relay_lines(iter([b"/ip4/1/tcp/2\n", b"step 1\n"]), out, False, lambda: None)
    assert out.getvalue() == "step 1\n"
    relay_lines(iter([b"/ip4/1/tcp/2\n", b"step 1\n"]), out, True, lambda: None)
    assert out.getvalue() == "step 1\n/ip4/1/tcp/2\nstep 1\n"


def test_a_stdout_nobody_reads_does_not_block_the_child() -> None:
    """`join | less` left alone: our stdout's pipe is full and every write would block. The
    relay used to write in the reading loop, so the control process's pipe filled, its next
    print blocked and its whole loop stopped; now the lines past the backlog are dropped."""
    read_end, write_end = os.pipe()  # kept open, never read
    out = open(write_end, "w")  # noqa: SIM115
    child = subprocess.Popen([sys.executable, "-c", PRINTER], stdout=subprocess.PIPE)
    assert child.stdout is not None
    lines = []
    relay = threading.Thread(
        target=relay_lines, args=(child.stdout, out, True, lambda: lines.append(1)), daemon=True
    )
    try:
        relay.start()
        assert child.wait(timeout=30) == 0  # it printed everything: nothing blocked it
        relay.join(timeout=10)
        assert not relay.is_alive() and len(lines) == 20001
    finally:
        child.kill()
        child.wait()
        os.close(read_end)  # the writer's blocked write ends (a broken pipe)


def test_restarted_control_processes_share_one_writer() -> None:
    """A writer a control process, each blocked on a stalled stdout, piled up a thread and
    1,024 lines per restart; now the node has one."""
    read_end, write_end = os.pipe()  # kept open, never read
    out = open(write_end, "w")  # noqa: SIM115
    relay = StdoutRelay(out)
    before = threading.active_count()
    try:
        for restart in range(5):
            lines = [f"/ip4/1/tcp/{restart}\n".encode()] + [b"x" * 4000 + b"\n"] * 300
            relay.relay(iter(lines), restart == 0, lambda: None)
        assert threading.active_count() <= before + 1  # the one writer (was 5)
        assert relay.dropped > 0  # the stalled stdout's backlog filled: the rest dropped
    finally:
        os.close(read_end)  # the writer's blocked write ends (a broken pipe)
        relay.close()
    assert not relay.writer.is_alive()


def test_a_control_process_s_last_lines_still_in_its_pipe_reach_stdout() -> None:
    """The node stops once its control process exited: the relay may not have read the
    process's last lines yet ("the run is finished: stopping"). close() used to put its end
    mark in the backlog first, and those lines went nowhere."""
    out = io.StringIO()
    relay = StdoutRelay(out)
    reading = threading.Event()

    def source() -> Iterator[bytes]:
        yield b"/ip4/1/tcp/2\n"
        reading.set()
        time.sleep(0.3)  # the relay thread is slow to read the pipe's rest
        yield b"the run is finished: stopping\n"

    thread = threading.Thread(target=relay.relay, args=(source(), True, lambda: None))
    thread.start()
    assert reading.wait(5)
    relay.close()
    thread.join(5)
    assert out.getvalue().splitlines() == ["/ip4/1/tcp/2", "the run is finished: stopping"]


def test_a_relay_started_just_before_close_is_waited_for() -> None:
    """A control process that died at once: close() ran before its relay thread was scheduled
    and returned (writer not started) or saw no source, and its lines were lost."""
    out = io.StringIO()
    relay = StdoutRelay(out)

    def slow_to_start() -> Iterator[bytes]:
        time.sleep(0.2)  # the relay thread's first read comes after close() began
        yield b"/ip4/1/tcp/2\n"
        yield b"last line\n"

    thread = relay.start(slow_to_start(), True, lambda: None)
    relay.close()
    thread.join(5)
    assert out.getvalue().splitlines() == ["/ip4/1/tcp/2", "last line"]
    assert not relay.writer.is_alive()
