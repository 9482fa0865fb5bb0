"""`p2ptrain doctor`: will joining work from this machine? The local checks (the ports are free,
the data plane's daemon starts), the network checks (control/doctor.py, run in this process:
py-libp2p), and the verdict: joining works unless a check FAILed.

The daemon check runs in a child process (p2ptrain.worker.daemon_check: hivemind must not meet
py-libp2p in one process), started first and read last, so that it overlaps the network checks;
its process group is killed if the checks raise (Ctrl-C), and dies with it (its watchdog) if the
doctor is killed.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from p2ptrain import addresses, procs
from p2ptrain.control.doctor import Check, run_network_checks
from p2ptrain.errors import WireError
from p2ptrain.flags import python_module
from p2ptrain.node.supervisor import worker_available
from p2ptrain.records.messages import DaemonCheckReply, DeviceFacts
from p2ptrain.worker import private_tmp

DAEMON_TIMEOUT_S = 90.0  # hivemind's import (torch) and p2pd's start on a slow machine
ORDER = ("bootstrap", "reachability", "nat", "ports", "daemon", "device", "clock", "bandwidth")
NO_DEVICE_FIX = "join with --device auto, or name a device this machine has (cpu, cuda:I, mps)"
NO_DATA_PLANE_FIX = (
    "install the train extra (pip install 'p2ptrain[train]'), or join --control-only"
)


@dataclass(frozen=True)
class DoctorSettings:
    bootstrap: str
    listen: str = addresses.JOIN_LISTEN
    data_listen: str = addresses.JOIN_DATA_LISTEN
    announce: tuple[str, ...] = ()
    control_only: bool = False
    device: str = "auto"


@dataclass(frozen=True)
class Diagnosis:
    checks: tuple[Check, ...]
    facts: dict[str, Any]

    @property
    def ok(self) -> bool:
        """Joining will work: nothing FAILed."""
        return all(check.status != "FAIL" for check in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks], **self.facts}


def diagnose(settings: DoctorSettings) -> Diagnosis:
    """Every check, in ORDER."""
    control_host, control_port = addresses.listen_endpoint(settings.listen, "--listen")
    data_host, data_port = addresses.listen_endpoint(settings.data_listen, "--data-listen")
    addresses.check_announce(settings.announce, "--announce")
    addresses.check_peer_address(settings.bootstrap, "--bootstrap")  # before a child starts
    endpoints = [(control_host, control_port)]
    if not settings.control_only:
        endpoints.append((data_host, data_port))
    taken = taken_ports(endpoints)
    ports = ports_check(control_port, data_port, taken, settings.control_only)
    daemon = None
    if not settings.control_only and ports.status == "ok" and worker_available():
        daemon = start_daemon_check(settings.data_listen, settings.device)
    try:
        # a taken control port: the network checks listen elsewhere, reachability means nothing
        listen = f"/ip4/{control_host}/tcp/0" if control_port in taken else settings.listen
        report = run_network_checks(
            settings.bootstrap, listen, settings.announce, (control_port, data_port)
        )
        checks = {check.name: check for check in report.checks}
        if control_port in taken and "reachability" in checks:
            text = f"reachability: not checked (port {control_port} is taken)"
            checks["reachability"] = Check("reachability", "skip", text)
        checks["ports"] = ports
        checks["daemon"], device = daemon_check(daemon, settings.control_only, ports.status == "ok")
        checks["device"] = device_check(device, report.loss_scale, settings.control_only)
    finally:
        if daemon is not None and daemon.poll() is None:  # the checks raised (Ctrl-C)
            stop_daemon_check(daemon)
    ordered = tuple(checks[name] for name in ORDER if name in checks)
    facts = dict(report.facts)
    if checks["device"].status == "ok" and device is not None:
        facts.update(device=device.name, precision=run_precision(device, report.loss_scale))
    return Diagnosis(ordered, facts)


def taken_ports(endpoints: Sequence[tuple[str, int]]) -> set[int]:
    """The ports among `endpoints` that cannot be listened on now (port 0: any, never taken)."""
    return {port for host, port in endpoints if addresses.listen_problem(host, port) is not None}


def ports_check(control_port: int, data_port: int, taken: set[int], control_only: bool) -> Check:
    ports = [control_port] if control_only else [control_port, data_port]
    names = "/".join(str(p) if p else "any" for p in ports)
    if not control_only and control_port == data_port != 0:
        return Check(
            "ports",
            "FAIL",
            f"ports: control and data plane both on {control_port}",
            "give --listen and --data-listen different ports",
        )
    if taken:
        busy = "/".join(str(p) for p in sorted(taken))
        return Check(
            "ports",
            "FAIL",
            f"ports {busy} taken on this machine (another p2ptrain node?)",
            "stop what listens there, or pick free ports with --listen and --data-listen "
            "(then forward those)",
        )
    if not any(ports):
        return Check("ports", "ok", "ports: any free ones (port 0)")
    return Check("ports", "ok", f"ports {names} free")


def daemon_check(
    proc: subprocess.Popen[bytes] | None, control_only: bool, ports_ok: bool
) -> tuple[Check, DeviceFacts | None]:
    """The daemon's line and the device facts: from its child process, or why there was none."""
    if control_only:
        return Check("daemon", "skip", "data-plane daemon: not checked (--control-only)"), None
    if not ports_ok:
        return Check("daemon", "skip", "data-plane daemon: not started (see ports)"), None
    if proc is None:
        text = "data-plane daemon: hivemind and torch are not installed"
        return Check("daemon", "FAIL", text, NO_DATA_PLANE_FIX), None
    return finish_daemon_check(proc)


def device_check(facts: DeviceFacts | None, loss_scale: float | None, control_only: bool) -> Check:
    """Where the stage would train, and in what precision under this run (its `loss_scale`:
    worker/device.py), from the daemon check's child; FAIL if `--device` is not here."""
    if control_only:
        return Check("device", "skip", "device: not checked (--control-only)")
    if facts is None or "installed" in facts.error:
        return Check("device", "skip", "device: not checked (see the daemon's line)")
    if facts.error:
        return Check("device", "FAIL", f"device: {facts.error}", NO_DEVICE_FIX)
    memory = f"{facts.memory_bytes / 2**30:.0f} GiB"
    precision = run_precision(facts, loss_scale)
    return Check("device", "ok", f"device {facts.name} ({memory}): passes in {precision}")


def run_precision(facts: DeviceFacts, loss_scale: float | None) -> str:
    """What the passes compute in under a run of `loss_scale` (None: not known, both said)."""
    plain, scaled = facts.precision, facts.precision_scaled
    if loss_scale is None:
        return plain if plain == scaled else f"{plain} ({scaled} if the run sets loss_scale)"
    return scaled if loss_scale > 1.0 else plain


def start_daemon_check(data_listen: str, device: str = "auto") -> subprocess.Popen[bytes]:
    argv = python_module("p2ptrain.worker.daemon_check", "--listen", data_listen)
    argv += ["--device", device]
    return procs.spawn(argv, log_path=os.devnull, stdout=subprocess.PIPE)


def stop_daemon_check(proc: subprocess.Popen[bytes]) -> None:
    """Kill the check's process group (its p2pd too), and the temp folder it had no time to
    remove (worker/private_tmp.py)."""
    procs.kill_groups([proc])
    private_tmp.sweep_temp()


def finish_daemon_check(proc: subprocess.Popen[bytes]) -> tuple[Check, DeviceFacts | None]:
    """The daemon's line, and the device facts the child found (None: it said nothing that
    decodes: records/messages.py DaemonCheckReply)."""
    try:
        out, _ = proc.communicate(timeout=DAEMON_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_daemon_check(proc)
        text = f"data-plane daemon: no answer in {DAEMON_TIMEOUT_S:.0f} s"
        return Check("daemon", "FAIL", text, NO_DATA_PLANE_FIX), None
    try:
        reply = DaemonCheckReply.decode(out)
    except WireError:
        reply = DaemonCheckReply(False)
    if reply.ok:
        where = (reply.addrs or ("?",))[0].split("/p2p/")[0]
        settings = "".join(f", {k}={v}" for k, v in reply.go_runtime.items())
        text = f"data-plane daemon starts (p2pd on {where}{settings})"
        return Check("daemon", "ok", text), reply.device
    error = reply.error or f"exit code {proc.returncode}"
    fix = (
        NO_DATA_PLANE_FIX
        if "not installed" in error
        else "see the error; a free --data-listen port?"
    )
    return Check("daemon", "FAIL", f"data-plane daemon does not start: {error}", fix), reply.device
