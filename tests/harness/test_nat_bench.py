"""`bench nat`'s report (harness/nat_bench.py) from a status document, without a testbed: links
counted per peer by how they go, the relays' bytes summed, and the acceptance checks."""

from __future__ import annotations

from typing import Any

from p2ptrain.harness.nat_bench import _checks, _peers, _relay_bytes
from p2ptrain.records import SwarmStatus
from tests.records.samples import A, B, C, status_dict

D = "12D3KooWD4444444444444444444444444444444444444444444"
NATS = ("none", "cone", "cone", "symmetric")


def status(kinds: dict[tuple[str, str], str]) -> SwarmStatus:
    data = status_dict()
    peer = data["peers"][0]
    data["peers"] = [
        {
            **peer,
            "id": p,
            "reachability": "public" if p == A else "private",
            "metrics": {**peer["metrics"], "relay_bytes": 1000 if p == A else None},
        }
        for p in (A, B, C, D)
    ]
    data["links"] = [
        {"a": a, "b": b, "rtt_ms": 10.0, "bandwidth_mbps": 20.0, "age_s": 1.0, "connection": kind}
        for (a, b), kind in kinds.items()
    ]
    data["observed_by"] = A
    data["relay_bytes"] = 5000
    return SwarmStatus.from_dict(data)


def links(cone_pair: str) -> dict[tuple[str, str], str]:
    """A public, B and C cone, D symmetric: every link to A direct, D's others relayed."""
    return {
        (A, B): "direct",
        (A, C): "direct",
        (A, D): "direct",
        (B, C): cone_pair,
        (B, D): "relayed",
        (C, D): "relayed",
    }


def report(cone_pair: str) -> dict[str, Any]:
    seen = status(links(cone_pair))
    peers = _peers([A, B, C, D], NATS, {A, B, C, D}, seen)
    return {"peers": peers, "loss": [5.0, 4.0], "processes_left": 0}


def test_each_peer_counts_its_links_by_how_they_go() -> None:
    peers = report("holepunched")["peers"]
    assert [p["links"] for p in peers] == [
        {"direct": 3, "holepunched": 0, "relayed": 0},
        {"direct": 1, "holepunched": 1, "relayed": 1},
        {"direct": 1, "holepunched": 1, "relayed": 1},
        {"direct": 1, "holepunched": 0, "relayed": 2},
    ]
    assert [p["reachability"] for p in peers] == ["public", "private", "private", "private"]


def test_the_checks_pass_only_when_cone_peers_punched_and_symmetric_ones_relayed() -> None:
    assert all(_checks(report("holepunched"), NATS, baseline=False).values())
    relayed = _checks(report("relayed"), NATS, baseline=False)
    assert not relayed["cone_pairs_holepunched"] and relayed["symmetric_peers_relayed"]
    stalled = {**report("holepunched"), "loss": [5.0, 5.1]}
    assert not _checks(stalled, NATS, baseline=False)["loss_falls"]
    far = {**report("holepunched"), "baseline_loss": [5.0, 3.0]}
    assert not _checks(far, NATS, baseline=True)["loss_as_all_public"]


def test_relay_bytes_add_the_observer_the_members_and_a_killed_relay() -> None:
    assert _relay_bytes(status(links("holepunched")), 700, [A, B, C, D]) == 5000 + 700
    assert _relay_bytes(None, 700, [A]) == 700
