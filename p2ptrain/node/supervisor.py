"""Supervises one node: the control process and, when available, the worker process.

No orphans, whatever happens:
- each child runs in its own session/process group (so its whole subtree can be signalled) and
  gets PR_SET_PDEATHSIG=SIGKILL, so it dies even if the supervisor is SIGKILLed;
- SIGTERM/SIGINT/SIGHUP to the supervisor stop both children: SIGTERM to the control process
  first (a node whose worker alone holds a stage stays until the next plan's peers have its
  state, at most HANDOVER_LIMIT_S, and a second signal cuts that short: control/handover.py),
  then SIGTERM to the control process's group and to the worker, which saves and then closes
  its own children in order; SIGKILL to both groups after a grace period.
A control process that dies (a crash, a kill) is started again after a back-off (1 s, doubling,
at most 30 s, back to 1 s once one stayed up a minute), one log line per restart saying why; the
worker keeps its state and training meanwhile and reconnects (worker/ipc.py). The node stops when
the worker exits, when the control process finishes (exit 0) or the run refuses it (exit 2), or
when the first control process dies before printing its address (a start that cannot work).
The control process prints the node's multiaddr first, then a progress line per training step
(control/progress.py); the supervisor relays them as its own stdout (a restarted control
process's address goes to the log: stdout's first line stays the node's first address). Where
stderr can stall (a pipe, a terminal: not a file), the children's log lines and the supervisor's
own reach it through a relay too, which drops lines rather than let a stalled reader block a
loop (node/stdout_relay.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from p2ptrain import addresses, procs
from p2ptrain.control.settings import (
    HANDOVER_LIMIT_FILE,
    HANDOVER_LIMIT_S,
    MAX_HANDOVER_S,
    ControlSettings,
)
from p2ptrain.errors import UserError
from p2ptrain.flags import python_module
from p2ptrain.key_file import load_or_create_identity
from p2ptrain.node.identity_lock import IdentityLock
from p2ptrain.node.ipc_dir import IpcDir
from p2ptrain.node.settings import NodeSettings
from p2ptrain.node.stdout_relay import WRITER_DRAIN_S, StderrRelay, StdoutRelay, stderr_relay
from p2ptrain.worker.faults import NO_FAULTS, Faults
from p2ptrain.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

# a stopping worker saves first, then serves its groupmates' replies still open (at most the
# plan's reducer timeout: 10 s on a LAN) and its outer round's last sends (10 s); past this it
# is killed, its checkpoint written
STOP_GRACE_S = 30.0
DEVICE_CHECK_TIMEOUT_S = 120.0  # importing torch and asking the driver: seconds, cold minutes
POLL_S = 0.2
# control exit codes that stop the node: finished, and refused by the run (control/node.py)
FINAL_CONTROL_CODES = (0, 2)


@dataclass
class Backoff:
    """How long to wait before restarting a process that exited after `uptime_s`: first_s,
    doubling on each quick exit up to cap_s; first_s again once one stayed up stable_s."""

    first_s: float = 1.0
    cap_s: float = 30.0
    stable_s: float = 60.0
    next_s: float = 1.0

    def after_exit(self, uptime_s: float) -> float:
        if uptime_s >= self.stable_s:
            self.next_s = self.first_s
        delay_s = self.next_s
        self.next_s = min(self.next_s * 2, self.cap_s)
        return delay_s


def worker_available() -> bool:
    """True where the data plane can run: the `train` extra (torch, hivemind) is installed. A
    base install (a bootstrap, an observer) runs the control plane only."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "hivemind"))


def check_device_here(name: str) -> None:
    """UserError unless the worker could train on `--device name` here. Judged before the node
    joins (found by the worker, it stopped a node that had joined), in a short child process:
    importing torch here would keep it in the supervisor's memory for the whole run."""
    if name in ("auto", "cpu"):
        return  # always here
    try:
        probe = subprocess.run(
            python_module("p2ptrain.worker.device", name),
            capture_output=True,
            text=True,
            timeout=DEVICE_CHECK_TIMEOUT_S,
            check=False,
            preexec_fn=procs.parent_death(signal.SIGKILL),  # a hung driver's probe goes with us
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"--device {name}: torch did not answer in {DEVICE_CHECK_TIMEOUT_S:.0f} s "
            "(a driver that hangs?)"
        ) from None
    if probe.returncode == 2:
        raise UserError(probe.stdout.strip())
    if probe.returncode != 0:  # the worker would fail the same way: say so now
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"--device {name}: cannot be checked here ({last})")


class Supervisor:
    """Runs one node until a signal arrives or a child exits; returns an exit code."""

    def __init__(self, node: NodeSettings, faults: Faults = NO_FAULTS) -> None:
        self.node = node
        self.faults = faults
        self.announce = addresses.check_announce(node.announce, "--announce")
        # checked now, so that a mistake stops `join` with one line before anything starts
        self.data_host, self.data_port = addresses.listen_endpoint(
            node.data_listen, "--data-listen"
        )
        self.data_announce = addresses.data_announce(
            node.announce, node.announce_data, self.data_port
        )
        addresses.check_can_listen(node.listen, "--listen")  # before a child takes a port
        if not node.control_only:
            addresses.check_can_listen(node.data_listen, "--data-listen")
        self.with_worker = not node.control_only and worker_available()
        if self.with_worker:
            check_device_here(node.device)
        if not node.control_only and not self.with_worker:
            log.warning(
                "torch and hivemind are not installed (pip install 'p2ptrain[train]'): "
                "running the control plane only"
            )
        self._stop_signal: int | None = None
        self._signals = 0  # how many stop signals came: a second one cuts a hand-over short
        self._addr_printed = threading.Event()
        self.stdout = StdoutRelay(sys.stdout)  # one writer for every control process's lines
        self.stderr: StderrRelay | None = None  # while run() runs, where stderr can stall
        self._stderr_reads: dict[int, threading.Thread] = {}  # a child's PID: its relay
        self.control_backoff = Backoff()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum
        self._signals += 1

    def run(self) -> int:
        # the children's log lines and ours through a relay: a stalled stderr blocked them all
        self.stderr = stderr_relay()
        if self.stderr is not None:
            self.stderr.take_over_logging()
        try:
            return self._run()
        finally:
            if self.stderr is not None:
                self.stderr.close()  # what is held is written (a healthy stderr gets it all)

    def _run(self) -> int:
        load_or_create_identity(
            self.node.identity
        )  # create it once, before two children race for it
        lock = IdentityLock(self.node.identity)  # one node per identity: node/identity_lock.py
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        ipc_dir = IpcDir(self.node.identity)  # beside the identity: node/ipc_dir.py
        ipc_path = ipc_dir.path
        children: list[subprocess.Popen[bytes]] = []
        try:
            control = self._start_control(ipc_path, first=True)
            children.append(control)
            while not self._addr_printed.is_set():
                if self._stop_signal is not None or control.poll() is not None:
                    return self._finish(children)
                self._addr_printed.wait(POLL_S)
            if self.with_worker:
                worker = WorkerSettings.from_args(
                    self.node,
                    ipc=ipc_path,
                    listen_host=self.data_host,
                    listen_port=self.data_port,
                    announce=self.data_announce,
                    faults=self.faults,
                )
                # the worker holds the identity's lock too, until it is gone
                children.append(
                    self._relay_stderr(
                        procs.spawn(
                            worker.command(), stderr=self._child_stderr(), pass_fds=(lock.fd,)
                        )
                    )
                )
            self._watch(children, ipc_path)
            self._let_control_leave(children, Path(ipc_path).parent / HANDOVER_LIMIT_FILE)
            return self._finish(children)
        finally:
            # the worker closes its averager, DHT and p2pd itself, after its last save: signalled
            # as a group they died at once, and a groupmate's round under way failed with them
            procs.stop_groups(children, STOP_GRACE_S, leaders_only=children[1:])
            self.stdout.close()
            ipc_dir.remove()
            lock.release()

    def _start_control(self, ipc_path: str, first: bool) -> subprocess.Popen[bytes]:
        settings = ControlSettings.from_args(
            self.node,
            role="trainer" if self.with_worker else "control-only",
            announce=self.announce,
            ipc=ipc_path,
        )
        control = procs.spawn(
            settings.command(), stdout=subprocess.PIPE, stderr=self._child_stderr()
        )
        assert control.stdout is not None
        self.stdout.start(control.stdout, first, self._addr_printed.set)
        return self._relay_stderr(control)

    def _child_stderr(self) -> int | None:
        """A pipe for the relay where our stderr can stall; else (a file) the child's is ours."""
        return subprocess.PIPE if self.stderr is not None else None

    def _relay_stderr(self, child: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        if self.stderr is not None and child.stderr is not None:
            self._stderr_reads[child.pid] = self.stderr.start(child.stderr)
        return child

    def _read_last_lines(self, child: subprocess.Popen[bytes]) -> None:
        """Let the relay read an exited child's last log lines (a moment at most: a grandchild
        may hold its pipe), so that ours about its exit follow them, as they did when the child
        wrote to our stderr itself."""
        thread = self._stderr_reads.pop(child.pid, None)
        if thread is not None:
            thread.join(WRITER_DRAIN_S)

    def _watch(self, children: list[subprocess.Popen[bytes]], ipc_path: str) -> None:
        """Until a signal, or a child's exit that stops the node: restart a control process
        that died (children[0]), after its back-off."""
        started = time.monotonic()
        while self._stop_signal is None:
            control, *others = children
            code = control.poll()
            if any(c.poll() is not None for c in others) or code in FINAL_CONTROL_CODES:
                return
            if code is None:
                _reap_orphans_as_init(children)
                time.sleep(POLL_S)
                continue
            uptime_s = time.monotonic() - started
            delay_s = self.control_backoff.after_exit(uptime_s)
            self._read_last_lines(control)  # its traceback, then our line
            log.warning(
                "the control process %s after %.0f s: restarting it in %.0f s",
                _exit_reason(code),
                uptime_s,
                delay_s,
            )
            procs.kill_group(control)  # whatever it left in its group
            deadline = time.monotonic() + delay_s
            while self._stop_signal is None and time.monotonic() < deadline:
                if any(c.poll() is not None for c in others):
                    return
                time.sleep(POLL_S)
            if self._stop_signal is not None:
                return
            children[0] = self._start_control(ipc_path, first=False)
            started = time.monotonic()

    def _let_control_leave(self, children: list[subprocess.Popen[bytes]], limit_file: Path) -> None:
        """On a stop signal, the control process stops first: while its worker alone holds a
        stage it keeps the node up until the next plan's peers have that stage's state
        (control/handover.py: its limit, which it writes to `limit_file`, grows with the
        stage's size), then asks the worker to stop. Another signal is passed on (it stops at
        once then); a third stops waiting for it."""
        control = children[0]
        if self._stop_signal is None or len(children) < 2 or control.poll() is not None:
            return
        # the first signal's SIGTERM now; one that came before we got here (a fast double
        # Ctrl-C) is passed on at the loop's first look, a poll later (two at once may merge)
        first = passed = 1
        control.send_signal(signal.SIGTERM)
        started = time.monotonic()
        while control.poll() is None and time.monotonic() < started + _limit(limit_file):
            if any(child.poll() is not None for child in children[1:]):
                return  # the worker is gone: nothing left to hand over
            if self._signals > passed:
                if self._signals > first + 1:
                    return
                passed = self._signals
                control.send_signal(signal.SIGTERM)
            time.sleep(POLL_S)

    def _finish(self, children: list[subprocess.Popen[bytes]]) -> int:
        if self._stop_signal is not None:
            log.info("signal %d: stopping the node", self._stop_signal)
            return 0
        for child in children:
            code = child.poll()
            if code is not None:
                self._read_last_lines(child)  # its last words (a refusal's line) come first
            if code == 0:
                log.info("%s finished: stopping the node", child.args[2])  # type: ignore[index]
                return 0
            if code == 2:  # refused: the child said why in one line; a third line adds nothing
                log.info("%s exited with 2: stopping the node", child.args[2])  # type: ignore[index]
                return code
            if code is not None:
                log.error("%s exited with %d: stopping the node", child.args[2], code)  # type: ignore[index]
                return code
        return 0


def _limit(limit_file: Path) -> float:
    """How long the control process may take to leave: the hand-over's limit it wrote (at least
    HANDOVER_LIMIT_S, at most MAX_HANDOVER_S) and the grace of a stop."""
    try:
        written = float(limit_file.read_text())
    except (OSError, ValueError):
        written = HANDOVER_LIMIT_S
    if written != written:  # NaN
        written = HANDOVER_LIMIT_S
    return min(max(written, HANDOVER_LIMIT_S), MAX_HANDOVER_S) + STOP_GRACE_S


def _reap_orphans_as_init(children: list[subprocess.Popen[bytes]]) -> None:
    """As PID 1 (a container without --init) the kernel hands us every orphan in the container
    (a child's escaped grandchild): reap the exited ones, or they stay zombies for good. Never
    our children's: their Popen reads their exit status (a control restart, a node's exit)."""
    if os.getpid() == 1:
        procs.reap_orphans(child.pid for child in children)


def _exit_reason(code: int) -> str:
    """'exited with 1' or 'was killed by SIGKILL' (Popen's negative code is the signal)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with {code}"
