"""Issue 26's live red team, the part that needs a NAT (root, /dev/net/tun): a bootstrap on
public testbed peer 0 relays for a `join --control-only` node behind a cone NAT (peer 1), both
started through the CLI with a soft open-file limit of 1024, and a member on public peer 2
(tests/redteam/nat_attacker.py) resets, mid-hello, every connection the NATed node punches to
it, resets every relayed circuit to it mid-way, and asks for punches at a victim on peer 3
(finding 1; tests/integration/test_red_team.py runs the rest on loopback). The NATed node
lives through it, keeps its relay slot and its verdict, and the victim gets no connection."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.testbed import LinkSpec, Testbed
from tests.conftest import PYTHON, ProcessReaper
from tests.control.swarm_helpers import P2PTRAIN, SOFT_NOFILE, bootstrap_argv, join_argv

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,  # ~50 s: the loopback red team runs in the default suite
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
    pytest.mark.skipif(not os.path.exists("/dev/net/tun"), reason="no /dev/net/tun"),
]

ATTACK_S = 30.0
STARTUP_TIMEOUT_S = 60.0
CLI = [*SOFT_NOFILE, *P2PTRAIN]
RUN = '[run]\nrun_id = "red-team-nat"\nworker_stall_s = 0.0\n'
VICTIM_PORT = 9999
VICTIM = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
with open(sys.argv[3], "a") as log:
    while True:
        conn, remote = server.accept()
        log.write(f"{remote}\\n")
        log.flush()
        conn.close()
"""


def _status(bed: Testbed, bootstrap: str) -> dict[str, Any] | None:
    argv = [PYTHON, "-m", "p2ptrain", "status", "--bootstrap", bootstrap, "--json"]
    done = bed.run(0, argv, 30)
    return json.loads(done.stdout) if done.returncode == 0 else None


def _peer(status: dict[str, Any] | None, peer_id: str) -> dict[str, Any]:
    return next((p for p in (status or {"peers": []})["peers"] if p["id"] == peer_id), {})


def _wait_for(predicate: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (value := predicate()):
        time.sleep(1.0)
    return predicate() if time.monotonic() >= deadline else value


def test_a_nated_node_survives_resets_of_its_punched_and_relayed_connections(
    tmp_path: Path,
) -> None:
    link = LinkSpec(delay_ms=2.0, rate_mbps=100.0)
    links = {(a, b): link for a in range(4) for b in range(4) if a != b}
    reaper = ProcessReaper()
    with Testbed(links, nat={1: "cone"}) as bed:
        try:
            (tmp_path / "run.toml").write_text(RUN)
            victim_log = tmp_path / "victim.txt"
            victim_log.touch()
            victim = reaper.start(
                bed.command(
                    3, [PYTHON, "-c", VICTIM, bed.address(3), str(VICTIM_PORT), str(victim_log)]
                ),
                stderr_path=tmp_path / "victim.log",
            )
            assert reaper.read_line(victim, STARTUP_TIMEOUT_S) == "ready"
            boot_argv = bootstrap_argv(
                tmp_path, "--run", str(tmp_path / "run.toml"), cli=CLI, listen=()
            )
            boot = reaper.start(bed.command(0, boot_argv), stderr_path=tmp_path / "boot.log")
            bootstrap = reaper.read_line(boot, STARTUP_TIMEOUT_S)
            node_argv = join_argv(
                bootstrap, tmp_path / "nated.key", "--quiet", control_only=True, cli=CLI, listen=()
            )
            node = reaper.start(bed.command(1, node_argv), stderr_path=tmp_path / "nated.log")
            target = reaper.read_line(node, STARTUP_TIMEOUT_S).rsplit("/p2p/", 1)[1]
            boot_id = bootstrap.rsplit("/p2p/", 1)[1]

            def reserved() -> dict[str, Any]:
                peer = _peer(_status(bed, bootstrap), target)
                ok = peer.get("reachability") == "private" and boot_id in peer.get("relays", [])
                return peer if ok else {}

            assert _wait_for(reserved, 90), _peer(_status(bed, bootstrap), target)
            attacker = reaper.start(
                bed.command(
                    2,
                    [
                        PYTHON,
                        "-m",
                        "tests.redteam.nat_attacker",
                        "--duration",
                        str(ATTACK_S),
                        "--run-id",
                        "red-team-nat",
                        "--bootstrap",
                        bootstrap,
                        "--relay",
                        f"{bed.address(0)}:7420",
                        "--target",
                        target,
                        "--victim",
                        f"{bed.address(3)}:{VICTIM_PORT}",
                        "--listen",
                        bed.address(2),
                    ],
                ),
                stderr_path=tmp_path / "attacker.log",
            )
            reaper.read_line(attacker, STARTUP_TIMEOUT_S)
            deadline = time.monotonic() + ATTACK_S + 30
            while attacker.poll() is None and time.monotonic() < deadline:
                for proc in (boot, node):
                    assert proc.poll() is None, f"{proc.args!r} died under attack"
                time.sleep(1.0)
            summary = json.loads(reaper.read_line(attacker, 60))
            print(json.dumps(summary, indent=1))  # shown when an assertion fails
            assert boot.poll() is None and node.poll() is None
            # the attacks went out: connections the NATed node took were reset mid-way
            assert summary.get("punched_resets", 0) > 0, summary
            assert summary.get("relayed_resets", 0) > 0, summary
            assert summary["victim_punches"] > 0 and summary["victim_punches_granted"] == 0
            # and it is still there, behind its NAT, with its relay slot
            assert _wait_for(reserved, 30), _peer(_status(bed, bootstrap), target)
            assert victim_log.read_text() == ""
        finally:
            reaper.close()
