"""A handle on a running testbed: run commands in its peers' namespaces, inject faults
(cut, degrade or restore links; disconnect, kill, freeze peers) and put peers behind NATs through
the forwarder's control socket. `Testbed` (testbed.py) builds one; `TestbedHandle.attach` finds
one from its state file, e.g. for the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2ptrain import procs
from p2ptrain.errors import UserError
from p2ptrain.procs import pid_alive
from p2ptrain.testbed import cpu, netns
from p2ptrain.testbed.links import LinkSpec, LinkTable
from p2ptrain.testbed.nat import NatMapping, check_nat_type, public_peer_address

STATE_DIR = Path("/run/p2ptrain-testbed")
CONTROL_TIMEOUT_S = 5.0
PeerRef = int | str


def peer_address(index: int) -> str:
    """The address of peer `index` inside its namespace (10.77.0.1, 10.77.0.2, ...)."""
    return f"10.77.{index // 250}.{index % 250 + 1}"


class TestbedHandle:
    """Commands and faults for a running testbed, described by its state dict."""

    __test__ = False  # not a pytest class

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.names: list[str] = list(state["names"])
        self.namespaces: list[str] = list(state["namespaces"])
        self.addresses: list[str] = list(state["addresses"])
        # where each peer's NAT would be reached (used while the peer is behind one)
        self.nat_addresses: list[str] = list(
            state.get("public_addresses", map(public_peer_address, range(len(self.addresses))))
        )
        self.configured: LinkTable = {
            (d["a"], d["b"]): LinkSpec(**d["spec"]) for d in state["links"]
        }
        # a cpu cgroup per peer where the host has the controller (testbed.start makes them)
        self.cgroups: list[str] = list(state.get("cgroups", []))
        self._spawned: list[subprocess.Popen[Any]] = []

    @classmethod
    def attach(cls, testbed_id: str | None = None) -> TestbedHandle:
        """Attach to the running testbed `testbed_id` (or the only one running)."""
        running = list_testbeds()
        if testbed_id is not None:
            running = [s for s in running if s["id"] == testbed_id]
        if not running:
            raise UserError("no running testbed" + (f" with id {testbed_id}" if testbed_id else ""))
        if len(running) > 1:
            ids = ", ".join(s["id"] for s in running)
            raise UserError(f"several testbeds are running ({ids}): pass --id")
        return cls(running[0])

    # -- peers -------------------------------------------------------------------------------
    @property
    def num_peers(self) -> int:
        return len(self.names)

    def index(self, peer: PeerRef) -> int:
        """A peer's index from its index, its name, its address or its NAT's address."""
        if isinstance(peer, int) or (isinstance(peer, str) and peer.isascii() and peer.isdigit()):
            index = int(peer)
            if 0 <= index < self.num_peers:
                return index
        for table in (self.names, self.addresses, self.namespaces, self.nat_addresses):
            if peer in table:
                return table.index(str(peer))
        raise UserError(f"no peer {peer!r} (peers are 0..{self.num_peers - 1} or their names)")

    def namespace(self, peer: PeerRef) -> str:
        return self.namespaces[self.index(peer)]

    def address(self, peer: PeerRef) -> str:
        """The peer's own (private) address: what it binds to inside its namespace, and what
        others dial while it is not behind a NAT."""
        return self.addresses[self.index(peer)]

    def public_address(self, peer: PeerRef) -> str:
        """Where others reach the peer now: its own address, or its NAT's public address (and
        then only through mappings the peer opened)."""
        index = self.index(peer)
        return (
            self.addresses[index] if self.nat_type(index) == "none" else self.nat_addresses[index]
        )

    def command(self, peer: PeerRef, argv: Sequence[str]) -> list[str]:
        """The argv that runs argv inside the peer's namespace (and its cpu cgroup)."""
        inside = netns.in_netns(self.namespace(peer), argv)
        return cpu.wrap(self.cgroups[self.index(peer)], inside) if self.cgroups else inside

    def set_cpu(self, peer: PeerRef, cores: float | None) -> None:
        """Limit every process of the peer, together, to `cores` of CPU time (None: no limit);
        it applies at once, to what runs now and what starts later."""
        if not self.cgroups:
            raise UserError("this testbed has no cpu cgroups (no cgroup cpu controller)")
        cpu.set_quota(self.cgroups[self.index(peer)], cores)

    def spawn(
        self, peer: PeerRef, argv: Sequence[str], **popen_kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start argv inside the peer's namespace, in a new session (killed as a group on close),
        killed with this thread if it dies first (`ip netns exec` and `sh -c 'exec'` keep it)."""
        popen_kwargs.setdefault("start_new_session", True)
        if threading.current_thread() is threading.main_thread():  # the signal follows the thread
            popen_kwargs.setdefault("preexec_fn", procs.parent_death(signal.SIGKILL))
        proc = subprocess.Popen(self.command(peer, argv), **popen_kwargs)
        self._spawned.append(proc)
        return proc

    def run(
        self, peer: PeerRef, argv: Sequence[str], timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside the peer's namespace to completion; output captured as text."""
        return subprocess.run(
            self.command(peer, argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def kill(self, peer: PeerRef, signum: int = signal.SIGKILL) -> int:
        """Send signum to every process in the peer's namespace; returns how many got it."""
        count = 0
        for pid in netns.netns_pids(self.namespace(peer)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
                count += 1
        return count

    def freeze(self, peer: PeerRef) -> int:
        """SIGSTOP every process of the peer (a hung peer: connections stay open, nothing moves)."""
        return self.kill(peer, signal.SIGSTOP)

    def thaw(self, peer: PeerRef) -> int:
        """SIGCONT every process of the peer."""
        return self.kill(peer, signal.SIGCONT)

    # -- links -------------------------------------------------------------------------------
    def _control(self, request: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(CONTROL_TIMEOUT_S)
            try:
                conn.connect(self.state["control"])
                conn.sendall(json.dumps(request).encode() + b"\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        break
                    data += chunk
            except OSError as exc:
                raise UserError(f"testbed {self.state['id']} does not answer: {exc}") from None
        reply: dict[str, Any] = json.loads(data)
        if not reply.get("ok"):
            raise UserError(f"testbed refused {request['op']}: {reply.get('error')}")
        return reply

    def links(self) -> LinkTable:
        """The directed links as the forwarder applies them now."""
        reply = self._control({"op": "links"})
        return {(d["a"], d["b"]): LinkSpec(**d["spec"]) for d in reply["links"]}

    def stats(self) -> dict[tuple[int, int], dict[str, int]]:
        """Per directed link: packets and bytes forwarded, packets dropped."""
        reply = self._control({"op": "stats"})
        return {(d["a"], d["b"]): d for d in reply["links"]}

    def set_link(
        self,
        a: PeerRef,
        b: PeerRef,
        *,
        both_ways: bool = True,
        delay_ms: float | None = None,
        rate_mbps: float | None = None,
        jitter_ms: float | None = None,
        loss: float | None = None,
        up: bool | None = None,
    ) -> None:
        """Change a link at runtime (unset fields keep their current value)."""
        ia, ib = self.index(a), self.index(b)
        if ia == ib:
            raise UserError("a link needs two different peers")
        current = self.links()
        pairs = [(ia, ib), (ib, ia)] if both_ways else [(ia, ib)]
        for key in pairs:
            spec = current[key].updated(
                delay_ms=delay_ms, rate_mbps=rate_mbps, jitter_ms=jitter_ms, loss=loss, up=up
            )
            self._control({"op": "set", "a": key[0], "b": key[1], "spec": spec.to_json()})

    def set_link_spec(self, a: PeerRef, b: PeerRef, spec: LinkSpec) -> None:
        """Replace one direction of a link with spec."""
        ia, ib = self.index(a), self.index(b)
        self._control({"op": "set", "a": ia, "b": ib, "spec": spec.to_json()})

    def cut_link(self, a: PeerRef, b: PeerRef, both_ways: bool = True) -> None:
        """Drop every packet on the link (connections stall, as on a real outage)."""
        self.set_link(a, b, both_ways=both_ways, up=False)

    def restore_link(self, a: PeerRef, b: PeerRef) -> None:
        """Put both directions back to the configured values."""
        ia, ib = self.index(a), self.index(b)
        for key in ((ia, ib), (ib, ia)):
            self.set_link_spec(*key, self.configured[key])

    def disconnect(self, peer: PeerRef) -> None:
        """Cut every link of the peer (its processes live on, unreachable)."""
        self._set_peer_up(self.index(peer), False)

    def reconnect(self, peer: PeerRef) -> None:
        """Undo disconnect (other changes to its links are kept)."""
        self._set_peer_up(self.index(peer), True)

    def _set_peer_up(self, index: int, up: bool) -> None:
        for (a, b), spec in self.links().items():
            if index in (a, b):
                self._control({"op": "set", "a": a, "b": b, "spec": spec.updated(up=up).to_json()})

    # -- NAT (nat.py) --------------------------------------------------------------------------
    def set_nat(self, peer: PeerRef, nat_type: str) -> None:
        """Put the peer behind a NAT: "none", "cone" or "symmetric" (its mappings start empty)."""
        self._control({"op": "set_nat", "peer": self.index(peer), "type": check_nat_type(nat_type)})

    def nat_stats(self) -> list[dict[str, Any]]:
        """Per peer: NAT type, public address, live mappings, packets its NAT dropped in/out."""
        return list(self._control({"op": "nat"})["nat"])

    def nat_type(self, peer: PeerRef) -> str:
        return str(self.nat_stats()[self.index(peer)]["type"])

    def nat_mappings(self, peer: PeerRef | None = None) -> list[NatMapping]:
        """The live NAT mappings (of one peer, or of all)."""
        request: dict[str, Any] = {"op": "mappings"}
        if peer is not None:
            request["peer"] = self.index(peer)
        return [NatMapping(**m) for m in self._control(request)["mappings"]]

    def kill_spawned(self) -> None:
        """SIGKILL the process groups started by spawn()."""
        for proc in self._spawned:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._spawned:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._spawned.clear()


def list_testbeds() -> list[dict[str, Any]]:
    """State dicts of the testbeds whose owner is alive."""
    found = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        if path.name.endswith(".forwarder.json"):
            continue
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(path.read_text())
            if pid_alive(int(state["owner_pid"])):
                found.append(state)
    return found
