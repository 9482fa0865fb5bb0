"""The averaging gather is one declared record (worker/averaging/checks.py's RoundGather): its
round's kind is a field (no longer a negative step), a state round's drift bound travels inside
it (no longer a key poked into the gathered dict), and what a groupmate gathers decodes into a
valid record or WireError, from a dict or from hivemind's gathered bytes."""

from __future__ import annotations

import random

import msgpack
import pytest
import torch

from p2ptrain.errors import WireError
from p2ptrain.worker.averaging.checks import (
    EXACT_TOLERANCE,
    GRAD,
    STATE,
    Checksums,
    RoundGather,
    check_round,
    checksums,
    is_later_round,
    median_claimed_norm,
)
from p2ptrain.worker.averaging.robust import MOMENTS_DRIFT_BOUND, PARAMS_DRIFT_BOUND
from tests.records.test_fuzz import _mutate_bytes, fuzz


class MSGPackSerializer:
    """hivemind's gathered bytes are msgpack (hivemind.utils.serializer): plain msgpack here,
    since hivemind and libp2p cannot share a test process (the unit tests' workers load both)."""

    @staticmethod
    def dumps(obj: object) -> bytes:
        return msgpack.packb(obj, use_bin_type=True)

    @staticmethod
    def loads(buf: bytes) -> object:
        return msgpack.unpackb(buf, raw=False, strict_map_key=False)


SUMS = Checksums(7, 2.0, 0.5, -1.5, 3.0, params=-4.0, params_norm=9.0)


def _hivemind_bytes(gather: object) -> bytes:
    """What hivemind's DecentralizedAverager.step sends of a member's `gather`: its bandwidth,
    its mode and our serialized value, serialized together."""
    return MSGPackSerializer.dumps([100.0, 0, MSGPackSerializer.dumps(gather)])


def test_a_gather_round_trips_with_its_kind_and_drift_bound() -> None:
    grad = RoundGather(GRAD, SUMS)
    state = RoundGather(STATE, SUMS, PARAMS_DRIFT_BOUND)
    assert RoundGather.from_dict(grad.to_dict()) == grad
    assert RoundGather.from_dict(state.to_dict()) == state
    assert state.to_dict()["drift_bound"] == PARAMS_DRIFT_BOUND
    assert RoundGather.from_hivemind(_hivemind_bytes(state.to_dict()), MSGPackSerializer) == state
    # the same number, two rounds: a gradient round and a state round never share a name
    assert grad.round_key != state.round_key and grad.checksums == state.checksums


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "resync"},  # not a kind
        {"kind": STATE},  # a state round names its drift bound
        {"drift_bound": MOMENTS_DRIFT_BOUND},  # ... and only a state round
        {"kind": STATE, "drift_bound": -1.0},
        {"kind": STATE, "drift_bound": float("nan")},
        {"checksums": {**SUMS.to_dict(), "step": -3}},  # the old state-round tag
        {"checksums": {**SUMS.to_dict(), "weight": 0.0}},
        {"checksums": None},
    ],
)
def test_a_malformed_gather_is_a_wire_error(change: dict) -> None:
    with pytest.raises(WireError):
        RoundGather.from_dict({**RoundGather(GRAD, SUMS).to_dict(), **change})


def test_a_state_round_gather_fails_a_gradient_round_of_the_same_number() -> None:
    """A member in a re-sync round and one in a gradient round, both numbered 3: today's code
    told them apart only by the sign of the step."""
    a, b = torch.randn(64), torch.randn(64)
    mine = checksums(a, 3, 1.0)
    gathered = {
        "a": RoundGather(GRAD, mine).to_dict(),
        "b": RoundGather(STATE, checksums(b, 3, 1.0), MOMENTS_DRIFT_BOUND).to_dict(),
    }
    problem = check_round((a + b) / 2, mine, gathered, EXACT_TOLERANCE, {"a": 1.0, "b": 1.0})
    assert problem is not None and "state round" in problem
    both = {"a": gathered["a"], "b": RoundGather(GRAD, checksums(b, 3, 1.0)).to_dict()}
    assert check_round((a + b) / 2, mine, both, EXACT_TOLERANCE, {"a": 1.0, "b": 1.0}) is None


def test_only_gradient_rounds_are_ordered() -> None:
    assert is_later_round("grad/5", "grad/4") and not is_later_round("grad/4", "grad/5")
    assert not is_later_round("state/9", "grad/4") and not is_later_round("grad/9", "state/4")
    for junk in ("", "5", "grad/", "grad/x", "grad/-1", "grad/" + "9" * 5000):
        assert not is_later_round(junk, "grad/4")
        assert not is_later_round("grad/4", junk)


def test_median_claimed_norm_skips_what_does_not_decode() -> None:
    good = [_hivemind_bytes(RoundGather(GRAD, SUMS).to_dict()) for _ in range(2)]
    junk = [b"", b"\xc1", _hivemind_bytes({"step": 7}), MSGPackSerializer.dumps([1, 2])]
    assert median_claimed_norm(good + junk, MSGPackSerializer) == SUMS.norm


def test_the_gather_decoder_is_total_over_mutated_dicts() -> None:
    sample = RoundGather(STATE, SUMS, PARAMS_DRIFT_BOUND).to_dict()
    num_valid = fuzz(RoundGather.from_dict, sample, 1500, seed=1)
    assert 0 < num_valid < 1500  # the mutations reach the checks, and some pass them


def test_the_gather_decoder_is_total_over_mutated_hivemind_bytes() -> None:
    """Bytes off the network (hivemind's gathered bytes, mutated or random): a record or
    WireError, never another exception."""
    rng = random.Random(3)
    sample = _hivemind_bytes(RoundGather(GRAD, SUMS).to_dict())
    inner = MSGPackSerializer.dumps(RoundGather(GRAD, SUMS).to_dict())
    num_valid = 0
    for index in range(1500):
        if index % 2:
            data = _mutate_bytes(rng, sample)
        else:  # our own bytes mutated, inside hivemind's valid envelope
            data = MSGPackSerializer.dumps([1.0, 0, _mutate_bytes(rng, inner)])
        try:
            RoundGather.from_hivemind(data, MSGPackSerializer)
            num_valid += 1
        except WireError:
            pass
    assert num_valid < 1500
