"""The testbed: one network namespace per peer, all their traffic through the link emulator.

    with Testbed.from_topology(load_topology("t.json"), bandwidth_scale=0.02) as bed:
        server = bed.spawn(0, ["python", "-m", "http.server", "8000"])
        bed.run(1, ["curl", f"http://{bed.address(0)}:8000/"])
        bed.cut_link(0, 1)       # faults: cut/degrade links, disconnect, kill, freeze peers
        bed.freeze(1); bed.thaw(1)

Each peer namespace holds one TUN device with address 10.77.x.y/16 (its whole route to the others,
plus 10.78.0.0/16: the public addresses of NATs, nat.py); the forwarder process in the root
namespace owns the other end of every TUN device. A `Testbed` owns the lifecycle and tears
everything down on exit; a `TestbedHandle` attaches to a running one (from its state file) to
inject faults or run commands, e.g. from the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from p2ptrain.errors import UserError
from p2ptrain.flags import python_module
from p2ptrain.testbed import cpu, netns
from p2ptrain.testbed.handle import STATE_DIR, TestbedHandle, list_testbeds, peer_address
from p2ptrain.testbed.links import LinkTable, links_from_topology
from p2ptrain.testbed.nat import NatTimeouts, check_nat_type, public_peer_address

NETNS_PREFIX = "p2tb"
DEFAULT_MTU = 9000  # jumbo frames: fewer packets per byte for the user-space forwarder
FORWARDER_START_TIMEOUT_S = 15.0
NAT_NETWORK = "10.78.0.0/16"  # public addresses of the peers' NATs (nat.public_peer_address)
# what a compute quota holds back: p2ptrain's training worker and the hivemind baseline's trainer
COMPUTE_COMMANDS = ("p2ptrain.worker", "p2ptrain.harness.dp_trainer")


class Testbed(TestbedHandle):
    """Creates the namespaces and the forwarder; close() (or leaving `with`) removes them all."""

    def __init__(
        self,
        links: LinkTable,
        names: Sequence[str] | None = None,
        mtu: int = DEFAULT_MTU,
        cpu_cores: dict[int, float] | None = None,
        compute_cores: dict[int, float] | None = None,
        compute_match: Sequence[str] = COMPUTE_COMMANDS,
        *,
        nat: dict[int, str] | None = None,
        nat_timeouts: NatTimeouts | None = None,
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
                "public_addresses": [public_peer_address(i) for i in range(num_peers)],
                "nat_timeouts": (nat_timeouts or NatTimeouts()).to_json(),
                "tun_names": [f"{NETNS_PREFIX}{self.id}t{i}" for i in range(num_peers)],
                "control": str(STATE_DIR / f"{self.id}.sock"),
                "links": [{"a": a, "b": b, "spec": s.to_json()} for (a, b), s in links.items()],
                "mtu": mtu,
            }
        )
        # peer -> "none" | "cone" | "symmetric": where the forwarder starts (set_nat changes it)
        nat_types = ["none"] * num_peers
        for i, nat_type in (nat or {}).items():
            nat_types[self.index(i)] = check_nat_type(nat_type)
        self.state["nat"] = nat_types
        self._forwarder: subprocess.Popen[bytes] | None = None
        self._created: list[str] = []
        # peer -> cores: slow peers (testbed/cpu.py); checked now, applied in start()
        self.cpu_cores = {self.index(i): cpu.check_cores(c) for i, c in (cpu_cores or {}).items()}
        # peer -> cores of its compute only: processes naming one of compute_match (cpu.py)
        self.compute_cores = {
            self.index(i): cpu.check_cores(c) for i, c in (compute_cores or {}).items()
        }
        self.compute_match = tuple(compute_match)
        self.compute_groups: list[str] = []
        self._mover: cpu.Mover | None = None

    @classmethod
    def from_topology(
        cls,
        topology: Any,
        *,
        bandwidth_scale: float | None = None,
        delay_scale: float = 1.0,
        mtu: int = DEFAULT_MTU,
        cpu_cores: dict[int, float] | None = None,
        compute_cores: dict[int, float] | None = None,
        nat: dict[int, str] | None = None,
        nat_timeouts: NatTimeouts | None = None,
    ) -> Testbed:
        """A testbed for a p2ptrain.schedule.Topology (rates scaled by bandwidth_scale;
        cpu_cores: peer index -> CPU quota in cores; compute_cores: the same for its worker;
        nat: peer index -> NAT type, nat_timeouts: its mappings' idle timeouts)."""
        kwargs = {} if bandwidth_scale is None else {"bandwidth_scale": bandwidth_scale}
        links = links_from_topology(
            topology.delay_ms, topology.bandwidth_gbps, delay_scale=delay_scale, **kwargs
        )
        return cls(
            links,
            topology.peers,
            mtu,
            cpu_cores,
            compute_cores,
            nat=nat,
            nat_timeouts=nat_timeouts,
        )

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
            self._create_cgroups()
            self.state_path.write_text(json.dumps(self.state))
        except BaseException:
            self.close()
            raise

    def _start_forwarder(self) -> None:
        config_path = STATE_DIR / f"{self.id}.forwarder.json"
        config_path.write_text(json.dumps(self.state))
        self._forwarder = subprocess.Popen(
            python_module("p2ptrain.testbed.forwarder", str(config_path)),
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
        netns.ip("route", "add", NAT_NETWORK, "dev", tun, netns=ns)  # other peers' NATs
        netns.ip("link", "set", "lo", "up", netns=ns)

    def _create_cgroups(self) -> None:
        """A cpu cgroup per peer, if the host has the controller (required with quotas)."""
        try:
            cpu.cpu_root()
        except UserError:
            if self.cpu_cores or self.compute_cores:
                raise
            return
        self.cgroups = [cpu.create(ns) for ns in self.namespaces]
        self.state["cgroups"] = self.cgroups
        for i, cores in self.cpu_cores.items():
            self.set_cpu(i, cores)
        pairs = []
        for i, cores in sorted(self.compute_cores.items()):
            group = cpu.create(f"{self.namespaces[i]}-compute")
            self.compute_groups.append(group)
            cpu.set_quota(group, cores)
            pairs.append((self.cgroups[i], group))
        if pairs:
            self._mover = cpu.Mover(pairs, self.compute_match)
            self._mover.start()

    def close(self) -> None:
        """Kill every process in the namespaces, stop the forwarder, delete the namespaces."""
        self.kill_spawned()
        for ns in self._created:
            netns.delete_netns(ns)
        self._created.clear()
        if self._mover is not None:
            self._mover.stop()
            self._mover = None
        for group in [*self.cgroups, *self.compute_groups]:
            cpu.remove(group)
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
    with contextlib.suppress(UserError):  # no cpu controller: no cgroups were made
        root, _ = cpu.cpu_root()
        for group in root.glob(f"{NETNS_PREFIX}*-*"):
            if group.name[len(NETNS_PREFIX) :].split("-")[0] not in live:
                cpu.remove(str(group))
    if STATE_DIR.is_dir():
        for path in STATE_DIR.iterdir():
            if path.name.split(".")[0] not in live:
                with contextlib.suppress(OSError):
                    path.unlink()
    return removed
