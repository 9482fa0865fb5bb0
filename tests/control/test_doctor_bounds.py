"""`p2ptrain doctor` takes the bootstrap's word only as far as join does (control/doctor.py):
the run spec must be signed by the bootstrap's own key, and the peers its status calls public
are dialled at most MAX_PEER_DIALS times, within PEER_SEARCH_S, status fetch included."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import trio
import trio.testing
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from p2ptrain import identity
from p2ptrain.control import doctor, doctor_servers, wire
from p2ptrain.control.doctor import NetworkReport
from p2ptrain.control.doctor_servers import CONNECT_TIMEOUT_S
from p2ptrain.records import RunSpec, SwarmStatus
from tests.web.synthetic import swarm

BOOTSTRAP = os.urandom(32)


class Host:
    """Dials nobody: counts the attempts."""

    def __init__(self) -> None:
        self.dials = 0

    async def connect(self, info: PeerInfo) -> None:
        self.dials += 1
        raise OSError("no answer")


def _check(monkeypatch: pytest.MonkeyPatch, envelope: bytes) -> tuple[NetworkReport, Any]:
    async def nothing(*args: object) -> None:
        return None

    async def call(*args: object) -> Any:
        return {"envelope": envelope.decode()}

    async def rtt(*args: object) -> float:
        return 5.0

    monkeypatch.setattr(doctor, "connect_operator_peer", nothing)
    monkeypatch.setattr(doctor.rpc, "call", call)
    monkeypatch.setattr(doctor.probe, "measure_rtt_ms", rtt)
    report = NetworkReport()
    info = PeerInfo(ID.from_base58(identity.peer_id_of(BOOTSTRAP)), [])
    rtt_ms = trio.run(doctor._check_bootstrap, report, None, info, "/ip4/192.0.2.1/tcp/1")
    return report, rtt_ms


def test_the_bootstrap_s_own_run_spec_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunSpec().replace(run_id="run-a")
    report, rtt_ms = _check(monkeypatch, wire.encode(BOOTSTRAP, 1, run, run_id="run-a"))
    assert rtt_ms == 5.0
    assert [c.status for c in report.checks] == ["ok"]
    assert report.facts["run"] == "run-a"


def test_a_run_spec_another_key_signed_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunSpec().replace(run_id="forged")
    report, rtt_ms = _check(monkeypatch, wire.encode(os.urandom(32), 1, run, run_id="forged"))
    assert rtt_ms is None
    assert [c.status for c in report.checks] == ["FAIL"]
    assert "did not sign" in report.checks[0].text
    assert report.loss_scale is None  # nothing of the forged run is used


def _public(count: int) -> SwarmStatus:
    status = swarm(count)
    peers = tuple(dataclasses.replace(p, reachability="public", alive=True) for p in status.peers)
    return dataclasses.replace(status, peers=peers)


def test_dials_are_capped_not_successes(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fetch(host: object, peer: object) -> SwarmStatus:
        return _public(100)

    monkeypatch.setattr(doctor_servers, "fetch_status_doc", fetch)
    host = Host()
    found = trio.run(
        doctor_servers.public_peers, host, None, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert found == []
    assert host.dials == doctor_servers.MAX_PEER_DIALS


def test_a_status_that_never_ends_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fetch(host: object, peer: object) -> SwarmStatus:
        await trio.sleep_forever()
        raise AssertionError

    monkeypatch.setattr(doctor_servers, "fetch_status_doc", fetch)
    host = Host()
    found = trio.run(
        doctor_servers.public_peers, host, None, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert found == []
    assert host.dials == 0


def test_slow_dials_end_with_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fetch(host: object, peer: object) -> SwarmStatus:
        return _public(100)

    class Slow(Host):
        async def connect(self, info: PeerInfo) -> None:
            self.dials += 1
            await trio.sleep_forever()

    monkeypatch.setattr(doctor_servers, "fetch_status_doc", fetch)
    monkeypatch.setattr(doctor_servers, "PEER_SEARCH_S", CONNECT_TIMEOUT_S)  # room for 2 dials
    host = Slow()
    found = trio.run(
        doctor_servers.public_peers, host, None, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert found == []
    assert host.dials == 2
