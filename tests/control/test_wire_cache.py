"""control/wire.py's VerifiedHeaders: a byte-identical copy of an envelope that passed is not
checked again (sync serves again what gossip brought); its age still is, and any other bytes
(a modified copy) take every check."""

from __future__ import annotations

import time

import pytest

from p2ptrain import identity
from p2ptrain.control import wire
from tests.control.test_wire import SEED, record_body


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """A fresh table, and the payloads whose signature was checked."""
    checked: list[bytes] = []
    verify = identity.verify

    def counting(key: bytes, payload: bytes, signature: bytes) -> bool:
        checked.append(payload)
        return verify(key, payload, signature)

    monkeypatch.setattr(wire, "_VERIFIED", wire.VerifiedHeaders(size=4))
    monkeypatch.setattr(identity, "verify", counting)
    return checked


def test_a_replayed_envelope_is_verified_once_and_a_modified_one_is_rejected(
    verifications: list[bytes],
) -> None:
    data = wire.sign(SEED, "peer", 7, record_body())
    first = wire.decode(data)
    for _ in range(3):
        assert wire.decode(data) == first
    assert len(verifications) == 1

    forged = data.replace(b'"compute_gflops":1.5', b'"compute_gflops":9.5')
    assert forged != data
    with pytest.raises(wire.WireError, match="forged"):
        wire.decode(forged)
    with pytest.raises(wire.WireError, match="forged"):
        wire.decode(forged)  # a failure is never remembered: checked again
    assert len(verifications) == 3


def test_a_remembered_envelope_still_ages_out(verifications: list[bytes]) -> None:
    written = time.time()
    data = wire.sign(SEED, "peer", 7, record_body(), ts=written)
    wire.decode(data, now=written)
    with pytest.raises(wire.WireError, match="stale"):
        wire.decode(data, now=written + wire.MAX_CLOCK_SKEW_S + 1)
    with pytest.raises(wire.WireError, match="skewed"):
        wire.decode(data, now=written - wire.MAX_CLOCK_SKEW_S - 1)
    assert wire.decode(data, now=written + 3600, max_age_s=7200).seq == 7  # a DHT record's age
    assert len(verifications) == 1


def test_the_table_is_bounded(verifications: list[bytes]) -> None:
    envelopes = [wire.sign(SEED, "peer", seq, record_body()) for seq in range(6)]
    for data in envelopes:
        wire.decode(data)
    wire.decode(envelopes[-1])  # remembered
    wire.decode(envelopes[0])  # forgotten (4 kept): checked again
    assert len(verifications) == 7
