"""`p2ptrain doctor`'s verdicts from given answers: reachability, clock skew, ports, lines."""

from __future__ import annotations

import socket
import time

import pytest

from p2ptrain.control.doctor import Check, NetworkReport, _clock, _reachability
from p2ptrain.node.doctor import Diagnosis, ports_check, taken_ports
from p2ptrain.records import DialBackReply, DialResult

OBSERVED = "/ip4/203.0.113.7/tcp/40123"


def reply(*oks: bool, error: str = "", time_s: float | None = None) -> DialBackReply:
    results = tuple(DialResult(f"/ip4/203.0.113.7/tcp/{7401 + i}", ok) for i, ok in enumerate(oks))
    return DialBackReply(OBSERVED, results, time.time() if time_s is None else time_s, error)


BOOT, OTHER, SAME_24 = "198.51.100.0/24", "8.8.8.0/24", "198.51.100.0/24"  # independence keys


def test_a_private_peer_is_told_which_ports_to_forward_and_what_to_announce() -> None:
    report = NetworkReport()
    check = _reachability(report, [reply(False), reply(False)], [BOOT, OTHER], (7401, 7402))
    # a warning: the planner places a private peer beside public ones, which it dials itself
    assert check.status == "warn" and report.facts["reachability"] == "private"
    assert "no dial-back reached /ip4/203.0.113.7/tcp/7401; 2 peer(s) tried" in check.text
    assert "hole punch or a public peer's relay" in check.text
    assert "let TCP 7401 and 7402 in: open them in the firewall" in check.fix
    assert "--announce /ip4/203.0.113.7/tcp/7401" in check.fix and "Behind NAT" in check.fix
    assert report.facts["observed"] == OBSERVED


def test_public_needs_the_bootstrap_and_a_second_network_as_a_node_decides() -> None:
    both = [reply(True), reply(False, True)]
    check = _reachability(NetworkReport(), both, [BOOT, OTHER], (7401, 7402))
    assert check.status == "ok" and "public" in check.text and "by 2 peer(s)" in check.text
    # on one machine there is no second network: the bootstrap's word is enough
    check = _reachability(NetworkReport(), [reply(True)], ["127.0.0.1"], (7401, 7402), True)
    assert check.status == "ok" and "public" in check.text


@pytest.mark.parametrize(
    ("replies", "networks", "verdict"),
    [
        ([None, reply(True)], [None, OTHER], "unknown"),  # one stranger's word: no verdict
        ([reply(True), reply(True)], [BOOT, SAME_24], "unknown"),  # one /24 is one opinion
        ([reply(True)], [BOOT], "unknown"),  # the bootstrap alone, off one machine
        ([reply(False), reply(True)], [BOOT, OTHER], "private"),  # the bootstrap says no
    ],
)
def test_one_server_reaching_us_is_not_called_public(
    replies: list[DialBackReply | None], networks: list[str | None], verdict: str
) -> None:
    report = NetworkReport()
    check = _reachability(report, replies, networks, (7401, 7402))
    assert report.facts["reachability"] == verdict
    assert check.status == "warn" and "public (" not in check.text


def test_no_verdict_is_a_warning_not_a_failure() -> None:
    report = NetworkReport()
    check = _reachability(report, [reply(error="rate limited"), None], [BOOT, None], (7401, 7402))
    assert check.status == "warn" and "rate limited" in check.text
    assert report.facts["reachability"] == "unknown"


@pytest.mark.parametrize(("skew_s", "status"), [(0.3, "ok"), (-5.0, "warn"), (20.0, "FAIL")])
def test_clock_skew_thresholds(skew_s: float, status: str) -> None:
    report = NetworkReport()
    check = _clock(report, reply(time_s=time.time() + skew_s), rtt_ms=10.0)
    assert check.status == status
    assert report.facts["clock_skew_s"] == pytest.approx(skew_s, abs=0.2)
    assert ("behind" if skew_s > 0 else "ahead of") in check.text


def test_ports_taken_or_shared_fail() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = taken_ports([("127.0.0.1", port), ("127.0.0.1", 0)])
    assert taken == {port}
    assert ports_check(port, 0, taken, False).status == "FAIL"
    assert ports_check(7401, 7401, set(), False).status == "FAIL"
    assert ports_check(7401, 7402, set(), False).text == "ports 7401/7402 free"
    assert ports_check(7401, 7401, set(), True).text == "ports 7401 free"  # no data plane


def test_lines_and_the_verdict() -> None:
    fail = Check("ports", "FAIL", "ports 7401 taken", "stop it")
    assert fail.line() == "FAIL ports 7401 taken — fix: stop it"
    assert Check("nat", "warn", "NAT: symmetric").line() == "warn NAT: symmetric"
    assert Diagnosis((Check("nat", "warn", "x"),), {}).ok
    diagnosis = Diagnosis((Check("nat", "ok", "x"), fail), {"nat": "none"})
    assert not diagnosis.ok and diagnosis.to_dict()["nat"] == "none"
