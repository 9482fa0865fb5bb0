"""Fuzzing the dial-back frames as the server and the requester parse them: mutated bytes and
the JSON of mutated records give a DialBackRequest / DialBackReply or the one wire error (they
were json.loads, whose UnicodeDecodeError, JSONDecodeError and RecursionError are not)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from p2ptrain.errors import WireError
from p2ptrain.records import DialBackReply, DialBackRequest
from p2ptrain.traversal.dialback import decode_reply, decode_request
from tests.records.samples import SAMPLES
from tests.records.test_fuzz import _mutate, _mutate_bytes, assert_no_slip

CASES: list[tuple[Callable[[bytes], Any], type, dict[str, Any]]] = [
    (decode, kind, data)
    for decode, kind in ((decode_request, DialBackRequest), (decode_reply, DialBackReply))
    for sample_kind, data in SAMPLES
    if sample_kind is kind
]
ODD = [b"\xff", b"", b"[" * 3000, b'{"addrs": [', b"9" * 5000, b"null", b'"\\ud800"', b"{}"]


@pytest.mark.parametrize("decode,kind,sample", CASES, ids=[k.__name__ for _, k, _ in CASES])
def test_a_mutated_dial_back_frame_is_its_record_or_a_wire_error(
    decode: Callable[[bytes], Any], kind: type, sample: dict[str, Any]
) -> None:
    body = json.dumps(sample).encode()
    assert isinstance(decode(body), kind)
    rng = random.Random(43)
    num_valid = 0
    for index in range(600):
        if index % 2:
            data = _mutate_bytes(rng, body)
        else:
            try:
                data = json.dumps(_mutate(rng, sample)).encode()
            except (ValueError, RecursionError):
                continue
        try:
            assert isinstance(decode(data), kind)
            num_valid += 1
        except WireError as exc:
            assert_no_slip(exc)
    assert num_valid < 600


@pytest.mark.parametrize("data", ODD)
def test_bytes_that_are_not_json_are_a_wire_error(data: bytes) -> None:
    for decode in (decode_request, decode_reply):
        with pytest.raises(WireError):
            decode(data)
