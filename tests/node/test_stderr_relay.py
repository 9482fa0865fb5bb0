"""The supervisor relays its children's stderr and its own log lines: a stalled stderr (`join 2>&1
| less` paused, Ctrl-S, a blocking log driver) blocked a child's next log line, and with it its
whole loop, and the supervisor's own log line blocked its loop, which then never acted on
SIGTERM. A regular file (a log redirect) never stalls: the children write to it as before."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from p2ptrain import procs
from p2ptrain.node.stdout_relay import StderrRelay

# far more log lines than a pipe holds (64 KiB), then a mark that the work is done
CHATTY = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s child: %(message)s")
    for i in range(20000):
        logging.warning("log line %d %s", i, "x" * 80)
    open(sys.argv[1], "w").write("done")
    """
)


def test_a_child_logging_to_a_stalled_stderr_keeps_working(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()  # kept open, never read: a paused `less`
    out = open(write_end, "w")  # noqa: SIM115
    relay = StderrRelay(out)
    done = tmp_path / "done"
    child = procs.spawn([sys.executable, "-c", CHATTY, str(done)], stderr=subprocess.PIPE)
    try:
        assert child.stderr is not None
        relay.start(child.stderr)
        assert child.wait(timeout=60) == 0  # hang guard: it logged everything, nothing blocked
        assert done.read_text() == "done"
        assert relay.dropped > 0  # past the backlog, dropped rather than waited for
    finally:
        procs.kill_groups([child])
        os.close(read_end)  # the writer's blocked write ends (a broken pipe)
        relay.close()
        out.close()
    assert not relay.writer.is_alive()


def test_own_log_lines_never_wait_for_a_stalled_stderr() -> None:
    read_end, write_end = os.pipe()  # kept open, never read
    out = open(write_end, "w")  # noqa: SIM115
    logger = logging.getLogger()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    relay = StderrRelay(out)
    relay.take_over_logging()
    logged = threading.Event()

    def log_a_lot() -> None:
        for i in range(20000):
            logging.getLogger("p2ptrain.test").warning("supervisor line %d %s", i, "y" * 80)
        logged.set()

    try:
        assert handler not in logger.handlers  # its lines go through the relay now
        threading.Thread(target=log_a_lot, daemon=True).start()
        assert logged.wait(60)  # hang guard: a blocked write would never return
    finally:
        os.close(read_end)
        relay.close()
        logger.removeHandler(handler)
        out.close()


def test_lines_reach_a_healthy_stderr_whole_with_the_log_format(tmp_path: Path) -> None:
    out = io.StringIO()
    logger = logging.getLogger()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    relay = StderrRelay(out)
    try:
        relay.take_over_logging()
        logging.getLogger("p2ptrain.node.supervisor").info("signal 15: stopping the node")
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stderr.write('one\\ntwo\\nno newline')"],
            stderr=subprocess.PIPE,
        )
        assert child.stderr is not None
        relay.start(child.stderr)
        child.wait(timeout=60)
        relay.close()  # writes what is held, and gives the handler back
        assert handler in logger.handlers
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert out.getvalue().splitlines() == [
        "INFO p2ptrain.node.supervisor: signal 15: stopping the node",
        "one",
        "two",
        "no newline",
    ]


def test_drops_are_noted_once_stderr_is_read_again() -> None:
    out = io.StringIO()
    relay = StderrRelay(out)
    for number in range(relay.backlog.maxsize + 5):  # the writer is not started: all held
        relay.put(f"line {number}\n")
    assert relay.dropped == 5
    relay._start_writer()
    relay.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "p2ptrain: stderr was not being read: 5 log lines dropped so far"
    assert lines[1:] == [f"line {n}" for n in range(relay.backlog.maxsize)]


def test_a_regular_file_is_left_to_the_children(tmp_path: Path) -> None:
    with open(tmp_path / "node.log", "w") as log_file:
        assert not StderrRelay.needed(log_file)
    read_end, write_end = os.pipe()
    with open(write_end, "w") as pipe:
        assert StderrRelay.needed(pipe)
    os.close(read_end)


SUPERVISED = textwrap.dedent(
    """
    import sys
    from p2ptrain.control.settings import ControlSettings
    from p2ptrain.node.settings import NodeSettings
    from p2ptrain.node.supervisor import Supervisor

    script, done, identity = sys.argv[1:4]  # the control process's
    ControlSettings.command = lambda self: [sys.executable, "-c", script, done]
    node = NodeSettings(
        bootstrap="/ip4/127.0.0.1/tcp/1", identity=identity, control_only=True,
        listen="/ip4/127.0.0.1/tcp/0", data_listen="/ip4/127.0.0.1/tcp/0",
    )
    import logging
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    sys.exit(Supervisor(node).run())
    """
)


def test_a_node_with_a_stalled_stderr_works_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The whole path: the control process's log lines fill the node's stalled stderr, its work
    goes on, and the supervisor acts on SIGTERM (its own log lines wait for nobody)."""
    read_end, write_end = os.pipe()  # the node's stderr: never read while it runs
    done = tmp_path / "done"
    # the control process: its address, then far more log lines than a pipe holds
    control = (
        "print('/ip4/127.0.0.1/tcp/1', flush=True)\n" + CHATTY + "import time\ntime.sleep(600)"
    )
    node = subprocess.Popen(
        [sys.executable, "-c", SUPERVISED, control, str(done), str(tmp_path / "node.key")],
        stdout=subprocess.PIPE,
        stderr=write_end,
        start_new_session=True,
    )
    os.close(write_end)
    try:
        assert node.stdout is not None
        assert node.stdout.readline() == b"/ip4/127.0.0.1/tcp/1\n"
        assert _wait_for(done, node)  # the control process logged all and went on
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=120) == 0  # hang guard: a blocked supervisor never exits
    finally:
        procs.kill_groups([node])
        os.close(read_end)


def _wait_for(path: Path, node: subprocess.Popen[bytes]) -> bool:
    """Until `path` exists (True) or the node exited (False); hang guard 120 s."""
    stop = threading.Event()
    for _ in range(1200):
        if path.exists():
            return True
        if node.poll() is not None:
            return False
        stop.wait(0.1)
    return False


def test_a_refusal_s_line_comes_before_the_supervisor_s(tmp_path: Path) -> None:
    """The control process says why it exits with 2 in one line: relayed, it still comes before
    the supervisor's own line about the exit, as when it wrote to our stderr itself."""
    control = "import sys\nsys.stderr.write('p2ptrain join: error: refused\\n')\nsys.exit(2)"
    node = subprocess.run(
        [sys.executable, "-c", SUPERVISED, control, "-", str(tmp_path / "node.key")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,  # hang guard
        check=False,
    )
    assert node.returncode == 2
    # the supervisor's line names the command's third word: the control's script here
    assert node.stderr.startswith("p2ptrain join: error: refused\n")
    assert node.stderr.endswith(" exited with 2: stopping the node\n")
    assert node.stderr.count("refused") == 2  # the child's line, then the script in ours
