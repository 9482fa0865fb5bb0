"""Reachability and `p2ptrain doctor` in the WAN testbed with emulated NATs (root, /dev/net/tun).

One swarm for the module: a bootstrap on public peer 0, `join --control-only` nodes on public
peer 1 and cone-NATed peer 2; `doctor` runs on peers that run nothing else: public peer 3,
cone-NATed peer 4 and symmetric-NATed peer 5. Every command is the shipped CLI.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.testbed import LinkSpec, Testbed
from tests.conftest import PYTHON, ProcessReaper
from tests.control.swarm_helpers import bootstrap_argv, join_argv

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
    pytest.mark.skipif(not os.path.exists("/dev/net/tun"), reason="no /dev/net/tun"),
]

NAT = {2: "cone", 4: "cone", 5: "symmetric"}
STARTUP_TIMEOUT_S = 30.0
VERDICT_TIMEOUT_S = 40.0  # a NATed node's first round: the dial-backs time out after 5 s
DOCTOR_TIMEOUT_S = 75.0  # the data-plane daemon check imports torch: slow on a loaded box
CLI = [PYTHON, "-m", "p2ptrain"]


class Swarm:
    def __init__(self, bed: Testbed, bootstrap: str, joined: dict[int, str]) -> None:
        self.bed = bed
        self.bootstrap = bootstrap
        self.joined = joined  # testbed peer -> its node's peer id

    def status(self) -> dict[str, Any] | None:
        done = self.bed.run(0, [*CLI, "status", "--bootstrap", self.bootstrap, "--json"], 30)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def reachability(self) -> dict[int, str]:
        peers = {p["id"]: p for p in (self.status() or {"peers": []})["peers"]}
        return {
            i: peers[peer_id]["reachability"]
            for i, peer_id in self.joined.items()
            if peer_id in peers
        }

    def doctor(self, peer: int, *flags: str) -> tuple[int, dict[str, Any], str]:
        argv = [*CLI, "doctor", "--bootstrap", self.bootstrap, "--json", *flags]
        done = self.bed.run(peer, argv, DOCTOR_TIMEOUT_S)
        lines = done.stdout.strip().splitlines()
        assert lines, done.stderr
        return done.returncode, json.loads(lines[-1]), done.stdout


def wait_for(predicate: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    return predicate()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    tmp: Path = tmp_path_factory.mktemp("reach")
    link = LinkSpec(delay_ms=5.0, rate_mbps=100.0)
    links = {(a, b): link for a in range(6) for b in range(6) if a != b}
    reaper = ProcessReaper()
    with Testbed(links, nat=NAT) as bed:
        try:
            (tmp / "run.toml").write_text("[run]\nworker_stall_s = 0.0\n")
            boot_argv = bootstrap_argv(tmp, "--run", str(tmp / "run.toml"), cli=CLI, listen=())
            boot = reaper.start(bed.command(0, boot_argv), stderr_path=tmp / "boot.log")
            bootstrap = reaper.read_line(boot, STARTUP_TIMEOUT_S)
            assert bootstrap.startswith(f"/ip4/{bed.address(0)}/tcp/7400/p2p/")
            joined = {}
            for peer in (1, 2):
                argv = join_argv(
                    bootstrap,
                    tmp / f"peer{peer}.key",
                    "--quiet",
                    control_only=True,
                    cli=CLI,
                    listen=(),
                )
                node = reaper.start(bed.command(peer, argv), stderr_path=tmp / f"peer{peer}.log")
                joined[peer] = reaper.read_line(node, STARTUP_TIMEOUT_S).rsplit("/p2p/", 1)[1]
            yield Swarm(bed, bootstrap, joined)
        finally:
            reaper.close()


def test_join_nodes_publish_their_reachability(swarm: Swarm) -> None:
    def settled() -> dict[int, str] | None:
        verdicts = swarm.reachability()
        return verdicts if len(verdicts) == 2 and "unknown" not in verdicts.values() else None

    assert wait_for(settled, VERDICT_TIMEOUT_S) == {1: "public", 2: "private"}


def test_doctor_on_a_public_peer(swarm: Swarm) -> None:
    wait_for(lambda: swarm.reachability().get(1) == "public", VERDICT_TIMEOUT_S)
    code, report, text = swarm.doctor(3)
    assert code == 0, text
    assert report["ok"] and report["reachability"] == "public" and report["nat"] == "none"
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    assert statuses == {
        "bootstrap": "ok",
        "reachability": "ok",
        "nat": "ok",
        "ports": "ok",
        "daemon": "ok",
        "device": "ok",
        "clock": "ok",
        "bandwidth": "ok",
    }, text
    assert report["device"] and report["precision"]  # where and how it would train
    assert report["observed"].startswith(f"/ip4/{swarm.bed.address(3)}/tcp/")
    assert abs(report["clock_skew_s"]) < 1.0 and report["bandwidth_mbps"] > 1.0


@pytest.mark.parametrize(("peer", "nat_type"), [(4, "cone"), (5, "symmetric")])
def test_doctor_behind_a_nat(swarm: Swarm, peer: int, nat_type: str) -> None:
    # the second UDP server (besides the bootstrap) is the public join node
    wait_for(lambda: swarm.reachability().get(1) == "public", VERDICT_TIMEOUT_S)
    code, report, text = swarm.doctor(peer, "--control-only")
    # joining works: the planner places a private peer beside public ones (the warning says
    # so, and how to be placeable anywhere)
    assert code == 0, text
    assert report["reachability"] == "private" and report["nat"] == nat_type, text
    checks = {check["name"]: check for check in report["checks"]}
    assert not [c for c in report["checks"] if c["status"] == "FAIL"], text
    assert checks["reachability"]["status"] == "warn", text
    public_ip = swarm.bed.public_address(peer)
    assert report["observed"].startswith(f"/ip4/{public_ip}/tcp/")
    assert f"--announce /ip4/{public_ip}/tcp/7401" in checks["reachability"]["fix"]
    assert "joining will work" in text
