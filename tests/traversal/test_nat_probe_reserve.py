"""The UDP observer's budget for connected sources (traversal/nat_probe.py): 32 spoofed source
IPs x 16 answers spent the 512 of a window and a `doctor` (connected to the server over TCP)
got no answer, so it reported NAT type unknown."""

from __future__ import annotations

import types

import pytest

from p2ptrain.net.ratelimit import WindowLimiter
from p2ptrain.records.reachability import udp_query
from p2ptrain.traversal import nat_probe
from p2ptrain.traversal.nat_probe import answer_for

QUERY = udp_query(b"\x01" * 8)
DOCTOR = "81.2.69.7"


def limiters() -> tuple[WindowLimiter, WindowLimiter]:
    window = nat_probe.UDP_WINDOW_S
    return (
        WindowLimiter(nat_probe.UDP_ANSWERS_PER_IP, nat_probe.UDP_ANSWERS_TOTAL, window),
        WindowLimiter(nat_probe.UDP_ANSWERS_PER_IP, nat_probe.CONNECTED_ANSWERS_TOTAL, window),
    )


def test_a_spoofed_flood_leaves_connected_sources_their_answers() -> None:
    open_budget, reserved = limiters()
    connected = (reserved, lambda ip: ip == DOCTOR)
    flood = sum(
        answer_for(QUERY, (f"81.3.{n}.1", 9), open_budget, 0.0, connected) is not None
        for n in range(32)
        for _ in range(16)
    )
    assert flood == nat_probe.UDP_ANSWERS_TOTAL  # the spoofed sources spent the open budget
    assert answer_for(QUERY, ("81.4.0.1", 9), open_budget, 1.0, connected) is None
    assert answer_for(QUERY, (DOCTOR, 5555), open_budget, 1.0, connected) is not None
    assert answer_for(QUERY, (DOCTOR, 5555), open_budget, 1.0) is None  # without the reserve


def test_connected_ips_are_read_at_most_once_a_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(nat_probe, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    reads: list[float] = []

    def ips() -> set[str]:
        reads.append(clock[0])
        return {DOCTOR} if clock[0] > 100.0 else set()

    has = nat_probe.cached(ips)
    assert [has(DOCTOR) for _ in range(1000)] == [False] * 1000 and len(reads) == 1
    clock[0] += nat_probe.CONNECTED_REFRESH_S
    assert has(DOCTOR) and len(reads) == 2
