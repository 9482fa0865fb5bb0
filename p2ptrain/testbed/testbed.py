"""The testbed: one network namespace per peer, all their traffic through the link emulator.

    with Testbed.from_topology(load_topology("t.json"), bandwidth_scale=0.02) as bed:
        server = bed.spawn(0, ["python", "-m", "http.server", "8000"])
        bed.run(1, ["curl", f"http://{bed.address(0)}:8000/"])
        bed.cut_link(0, 1)       # faults: cut/degrade links, disconnect, kill, freeze peers
        bed.freeze(1); bed.thaw(1)

Each peer namespace holds one TUN device with address 10.77.x.y/16 (its whole route to the others);
the forwarder process in the root namespace owns the other end of every TUN device. A `Testbed`
owns the lifecycle and tears everything down on exit; a `TestbedHandle` attaches to a running one
(from its state file) to inject faults or run commands, e.g. from the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from p2ptrain.errors import UserError
from p2ptrain.testbed import netns
from p2ptrain.testbed.links import LinkSpec, LinkTable, links_from_topology

STATE_DIR = Path("/run/p2ptrain-testbed")
NETNS_PREFIX = "p2tb"
DEFAULT_MTU = 9000  # jumbo frames: fewer packets per byte for the user-space forwarder
FORWARDER_START_TIMEOUT_S = 15.0
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
        self.configured: LinkTable = {
            (d["a"], d["b"]): LinkSpec(**d["spec"]) for d in state["links"]
        }
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
        """A peer's index from its index, its name or its address."""
        if isinstance(peer, int) or (isinstance(peer, str) and peer.isdigit()):
            index = int(peer)
            if 0 <= index < self.num_peers:
                return index
        for table in (self.names, self.addresses, self.namespaces):
            if peer in table:
                return table.index(str(peer))
        raise UserError(f"no peer {peer!r} (peers are 0..{self.num_peers - 1} or their names)")

    def namespace(self, peer: PeerRef) -> str:
        return self.namespaces[self.index(peer)]

    def address(self, peer: PeerRef) -> str:
        return self.addresses[self.index(peer)]

    def command(self, peer: PeerRef, argv: Sequence[str]) -> list[str]:
        """The argv that runs argv inside the peer's namespace."""
        return netns.in_netns(self.namespace(peer), argv)

    def spawn(
        self, peer: PeerRef, argv: Sequence[str], **popen_kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start argv inside the peer's namespace, in a new session (killed as a group on close)."""
        popen_kwargs.setdefault("start_new_session", True)
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

    def kill_spawned(self) -> None:
        """SIGKILL the process groups started by spawn()."""
        for proc in self._spawned:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._spawned:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._spawned.clear()


class Testbed(TestbedHandle):
    """Creates the namespaces and the forwarder; close() (or leaving `with`) removes them all."""

    def __init__(
        self, links: LinkTable, names: Sequence[str] | None = None, mtu: int = DEFAULT_MTU
    ) -> None:
        num_peers = 1 + max(max(key) for key in links) if links else 0
        if num_peers < 2 or any(
            (a, b) not in links for a in range(num_peers) for b in range(num_peers) if a != b
        ):
            raise UserError("a testbed needs links between every ordered pair of >= 2 peers")
        names = list(names) if names is not None else [f"peer{i}" for i in range(num_peers)]
        if len(names) != num_peers:
            raise UserError(f"{len(names)} names for {num_peers} peers")
        self.id = secrets.token_hex(3)
        super().__init__(
            {
                "id": self.id,
                "owner_pid": os.getpid(),
                "names": names,
                "namespaces": [f"{NETNS_PREFIX}{self.id}-{i}" for i in range(num_peers)],
                "addresses": [peer_address(i) for i in range(num_peers)],
                "tun_names": [f"{NETNS_PREFIX}{self.id}t{i}" for i in range(num_peers)],
                "control": str(STATE_DIR / f"{self.id}.sock"),
                "links": [{"a": a, "b": b, "spec": s.to_json()} for (a, b), s in links.items()],
                "mtu": mtu,
            }
        )
        self._forwarder: subprocess.Popen[bytes] | None = None
        self._created: list[str] = []

    @classmethod
    def from_topology(
        cls,
        topology: Any,
        *,
        bandwidth_scale: float | None = None,
        delay_scale: float = 1.0,
        mtu: int = DEFAULT_MTU,
    ) -> Testbed:
        """A testbed for a p2ptrain.schedule.Topology (rates scaled by bandwidth_scale)."""
        kwargs = {} if bandwidth_scale is None else {"bandwidth_scale": bandwidth_scale}
        links = links_from_topology(
            topology.delay_ms, topology.bandwidth_gbps, delay_scale=delay_scale, **kwargs
        )
        return cls(links, topology.peers, mtu)

    @property
    def state_path(self) -> Path:
        return STATE_DIR / f"{self.id}.json"

    def __enter__(self) -> Testbed:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Create everything; on any failure, remove what was created and re-raise."""
        netns.require_root()
        cleanup_stale()
        STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            self._start_forwarder()
            for i, ns in enumerate(self.namespaces):
                self._create_peer(i, ns)
            self.state_path.write_text(json.dumps(self.state))
        except BaseException:
            self.close()
            raise

    def _start_forwarder(self) -> None:
        config_path = STATE_DIR / f"{self.id}.forwarder.json"
        config_path.write_text(json.dumps(self.state))
        self._forwarder = subprocess.Popen(
            [sys.executable, "-m", "p2ptrain.testbed.forwarder", str(config_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
        )
        assert self._forwarder.stdout is not None
        line = _read_line(self._forwarder.stdout, FORWARDER_START_TIMEOUT_S)
        if line.strip() != b"ready":
            raise RuntimeError(f"link forwarder failed to start (exit {self._forwarder.poll()})")

    def _create_peer(self, index: int, ns: str) -> None:
        tun = self.state["tun_names"][index]
        netns.ip("netns", "add", ns)
        self._created.append(ns)
        # IPv6 off: the forwarder routes IPv4 only, and p2pd must not announce unusable addresses.
        subprocess.run(
            netns.in_netns(ns, ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]),
            capture_output=True,
            check=False,
        )
        netns.ip("link", "set", tun, "netns", ns)
        netns.ip("addr", "add", f"{self.addresses[index]}/16", "dev", tun, netns=ns)
        netns.ip("link", "set", tun, "mtu", str(self.state["mtu"]), "up", netns=ns)
        netns.ip("link", "set", "lo", "up", netns=ns)

    def close(self) -> None:
        """Kill every process in the namespaces, stop the forwarder, delete the namespaces."""
        self.kill_spawned()
        for ns in self._created:
            netns.delete_netns(ns)
        self._created.clear()
        if self._forwarder is not None:
            _stop(self._forwarder)
            self._forwarder = None
        for path in (
            self.state_path,
            STATE_DIR / f"{self.id}.forwarder.json",
            Path(self.state["control"]),
        ):
            with contextlib.suppress(OSError):
                path.unlink()


def _read_line(stream: IO[bytes], timeout_s: float) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return stream.readline() if ready else b""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()  # EOF: the forwarder exits and its TUN devices vanish
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_testbeds() -> list[dict[str, Any]]:
    """State dicts of the testbeds whose owner is alive."""
    found = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        if path.name.endswith(".forwarder.json"):
            continue
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(path.read_text())
            if _alive(int(state["owner_pid"])):
                found.append(state)
    return found


def cleanup_stale() -> list[str]:
    """Delete the namespaces and files of testbeds whose owner died (e.g. was SIGKILLed).

    Returns the namespaces deleted. Namespaces of live testbeds are left alone.
    """
    live = {s["id"] for s in list_testbeds()}
    removed = []
    for ns in netns.list_netns():
        if (
            ns.startswith(NETNS_PREFIX)
            and "-" in ns
            and ns[len(NETNS_PREFIX) :].split("-")[0] not in live
        ):
            netns.delete_netns(ns)
            removed.append(ns)
    if STATE_DIR.is_dir():
        for path in STATE_DIR.iterdir():
            if path.name.split(".")[0] not in live:
                with contextlib.suppress(OSError):
                    path.unlink()
    return removed
