"""Emulated NATs with real sockets in the testbed's namespaces (root, /dev/net/tun): a NATed peer
is unreachable until it opens a mapping, two cone-NATed peers punch a hole (UDP and TCP
simultaneous open) through what a rendezvous saw, a symmetric NAT defeats that, and idle mappings
expire."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.testbed import LinkSpec, NatTimeouts, Testbed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
    pytest.mark.skipif(not os.path.exists("/dev/net/tun"), reason="no /dev/net/tun"),
]

PEER = [sys.executable, str(Path(__file__).with_name("nat_peer.py"))]
RENDEZVOUS_PORT = 7000
REFUSED_TIMEOUT_S = 1.5  # a refused connect is a timeout: the NAT drops, it never answers
PUNCH_TIMEOUT_S = 4.0  # covers one TCP SYN retransmit (1 s) with room to spare
FAILED_PUNCH_S = 2.5  # how long a punch that must fail is given


def make_bed(nat: dict[int, str], timeouts: NatTimeouts | None = None) -> Testbed:
    """Four peers, 10 ms apart: 0 and 1 public unless nat says otherwise."""
    link = LinkSpec(delay_ms=10.0, rate_mbps=50.0)
    links = {(a, b): link for a in range(4) for b in range(4) if a != b}
    return Testbed(links, nat=nat, nat_timeouts=timeouts)


@pytest.fixture
def bed() -> Iterator[Testbed]:
    with make_bed({}) as testbed:
        yield testbed


def start(bed: Testbed, peer: int, *args: str) -> subprocess.Popen[str]:
    """A role in the background, with pipes to its stdin and stdout."""
    return bed.spawn(peer, [*PEER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    return dict(json.loads(proc.stdout.readline()))


def spawn(bed: Testbed, peer: int, *args: str) -> subprocess.Popen[str]:
    """A server role; returns once it is ready."""
    proc = start(bed, peer, *args)
    assert read(proc)["ready"]
    return proc


def run(bed: Testbed, peer: int, *args: str) -> dict[str, Any]:
    done = bed.run(peer, [*PEER, *args], timeout_s=30)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def tcp_connect(bed: Testbed, peer: int, server: str, local_port: int = 0) -> dict[str, Any]:
    return run(bed, peer, "connect", "tcp", server, str(local_port), str(REFUSED_TIMEOUT_S))


def hole_punch(
    bed: Testbed, kind: str, a: int, b: int, timeout_s: float = PUNCH_TIMEOUT_S
) -> tuple[dict[str, Any], ...]:
    """a and b learn their public endpoints from the rendezvous on peer 0, swap them (the test
    plays the signalling channel, as a relay does for DCUtR) and send to each other at once."""
    rendezvous = f"{bed.address(0)}:{RENDEZVOUS_PORT}"
    procs = [
        start(bed, peer, "punch", kind, rendezvous, str(port), str(timeout_s))
        for peer, port in ((a, 5001), (b, 5002))
    ]
    observed = [read(proc)["observed"] for proc in procs]
    for proc, other in zip(procs, reversed(observed), strict=True):
        assert proc.stdin is not None
        proc.stdin.write(other + "\n")
        proc.stdin.flush()
    results = []
    for proc, seen in zip(procs, observed, strict=True):
        out, _ = proc.communicate(timeout=timeout_s + 10)
        results.append({**json.loads(out), "observed": seen})
    return tuple(results)


def test_a_public_peer_is_reachable_as_before(bed: Testbed) -> None:
    spawn(bed, 0, "observe", "8000")
    reply = tcp_connect(bed, 1, f"{bed.address(0)}:8000", 6000)
    assert reply == {"ok": True, "observed": f"{bed.address(1)}:6000"}  # no translation
    assert bed.public_address(0) == bed.address(0)
    assert bed.nat_mappings() == []


@pytest.mark.parametrize("nat_type", ["cone", "symmetric"])
def test_a_natted_peer_takes_no_unsolicited_connection(nat_type: str) -> None:
    with make_bed({2: nat_type}) as bed:
        spawn(bed, 2, "observe", "8000")
        public = bed.public_address(2)
        assert public == "10.78.0.3" != bed.address(2)
        for address in (bed.address(2), public):  # neither its own address nor its NAT's
            assert not tcp_connect(bed, 1, f"{address}:8000")["ok"]
        assert bed.nat_stats()[2]["dropped_in"] >= 2
        # Its own connections go out, from its NAT's address and a mapped port...
        spawn(bed, 1, "observe", "8000")
        reply = tcp_connect(bed, 2, f"{bed.address(1)}:8000", 6000)
        assert reply["ok"]
        ip, port = reply["observed"].split(":")
        assert ip == public and int(port) != 6000
        # ...and the replies come back through the mapping they opened.
        [mapping] = bed.nat_mappings(2)
        assert (mapping.protocol, mapping.private_port, mapping.public_port) == (
            "tcp",
            6000,
            int(port),
        )
        assert mapping.remotes == [f"{bed.address(1)}:8000"]


@pytest.mark.parametrize("kind", ["udp", "tcp"])
def test_two_cone_natted_peers_punch_a_hole(kind: str) -> None:
    with make_bed({2: "cone", 3: "cone"}) as bed:
        spawn(bed, 0, "observe", str(RENDEZVOUS_PORT))
        first, second = hole_punch(bed, kind, 2, 3)
        assert first["ok"] and second["ok"], (first, second)
        assert first["received"] == second["received"] == ["punch"]
        assert first["observed"].startswith(bed.public_address(2) + ":")
        # Endpoint-independent: the rendezvous and the other peer saw one public port.
        ports = {m.public_port for m in bed.nat_mappings(2) if m.protocol == kind}
        assert ports == {int(first["observed"].split(":")[1])}


@pytest.mark.parametrize("kind", ["udp", "tcp"])
@pytest.mark.parametrize("nat", [{2: "symmetric", 3: "cone"}, {2: "symmetric", 3: "symmetric"}])
def test_a_symmetric_nat_defeats_hole_punching(kind: str, nat: dict[int, str]) -> None:
    with make_bed(nat) as bed:
        spawn(bed, 0, "observe", str(RENDEZVOUS_PORT))
        first, second = hole_punch(bed, kind, 2, 3, FAILED_PUNCH_S)
        assert not first["ok"] and not second["ok"], (first, second)
        # What the rendezvous saw is not the port used toward the other peer.
        to_other = [m for m in bed.nat_mappings(2) if m.remotes[0].startswith("10.78.0.4:")]
        assert to_other and to_other[0].public_port != int(first["observed"].split(":")[1])
        assert bed.nat_stats()[3]["dropped_in"] > 0


@pytest.mark.parametrize(
    ("nat_type", "expected"),
    [
        ("none", ["0.2:same", "0.4:other", "2.2:same"]),  # reachable: everything arrives
        ("cone", ["0.2:same"]),  # filtered by port, then expired
        ("symmetric", ["0.2:same"]),
    ],
)
def test_mappings_filter_by_remote_port_and_expire(nat_type: str, expected: list[str]) -> None:
    """Peer 1 answers peer 2 after 0.2 s from the port it was sent to, after 0.4 s from another
    port, and after 2.2 s (past the 1 s idle timeout) from the first port again."""
    with make_bed({2: nat_type}, NatTimeouts(tcp_s=1.0, udp_s=1.0)) as bed:
        server = spawn(bed, 1, "replies", "8000", "0.2:same,0.4:other,2.2:same")
        heard = run(bed, 2, "listen", "6000", f"{bed.address(1)}:8000", "3.0")["received"]
        assert [text for _, _, text in heard] == expected
        server.wait(timeout=5)
        assert bed.nat_mappings(2) == []  # freed, not only ignored


def test_a_peer_goes_behind_a_nat_at_runtime(bed: Testbed) -> None:
    spawn(bed, 2, "observe", "8000")
    assert tcp_connect(bed, 1, f"{bed.address(2)}:8000")["ok"]
    bed.set_nat(2, "cone")
    assert bed.nat_type(2) == "cone" and bed.public_address(2) == "10.78.0.3"
    assert not tcp_connect(bed, 1, f"{bed.address(2)}:8000")["ok"]
    bed.set_nat(2, "none")
    assert tcp_connect(bed, 1, f"{bed.address(2)}:8000")["ok"]
