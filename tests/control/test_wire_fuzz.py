"""Fuzzing the control plane's byte decoders: a signed envelope (mutated bytes, and mutated
bodies signed again, as a hostile member can sign anything), the rejoin file that keeps one, and
the paged and sync requests. Each gives its record (None where documented) or the one wire
error, never another exception, and never the backstop's catch of a reader's slip."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from p2ptrain import identity
from p2ptrain.control import rejoin, sync, wire
from p2ptrain.errors import WireError
from p2ptrain.net import paging
from p2ptrain.records import RunSpec
from p2ptrain.records.replies import SyncRequest
from tests.records.samples import SAMPLES
from tests.records.test_fuzz import _mutate, _mutate_bytes, assert_no_slip, json_texts

SEED = bytes(range(32))
AUTHOR = identity.peer_id_of(SEED)
NOW = time.time()
KIND_SAMPLES = [(wire.KIND_OF[kind], data) for kind, data in SAMPLES if kind in wire.KIND_OF]


def _decodes(data: bytes) -> wire.Envelope | None:
    """The envelope, or None for the wire error (checked: not a slip)."""
    try:
        envelope = wire.decode(data, now=NOW)
    except WireError as exc:
        assert_no_slip(exc)
        return None
    assert isinstance(envelope.body, tuple(wire.KIND_OF))
    return envelope


def test_every_body_kind_is_sampled() -> None:
    assert {kind for kind, _ in KIND_SAMPLES} == set(wire.BODY_RECORDS)


@pytest.mark.parametrize("kind,body", KIND_SAMPLES, ids=[k for k, _ in KIND_SAMPLES])
def test_mutated_envelope_bytes_are_an_envelope_or_a_wire_error(kind: str, body: Any) -> None:
    sample = wire.sign(SEED, kind, 7, body, ts=NOW, run_id="r")
    assert _decodes(sample) is not None
    rng = random.Random(17)
    num_valid = sum(_decodes(_mutate_bytes(rng, sample)) is not None for _ in range(150))
    assert num_valid < 150


@pytest.mark.parametrize("kind,body", KIND_SAMPLES, ids=[k for k, _ in KIND_SAMPLES])
def test_mutated_bodies_signed_again_are_an_envelope_or_a_wire_error(kind: str, body: Any) -> None:
    """A member's key signs whatever it likes: only the body's schema stands in the way."""
    rng = random.Random(19)
    num_signed = 0
    for _ in range(150):
        mutated = _mutate(rng, body)
        if not isinstance(mutated, dict):  # a body that is not an object: wire.sign's caller's
            mutated = {"body": mutated}
        try:
            data = wire.sign(SEED, kind, rng.randrange(2**63), mutated, ts=NOW)
        except (ValueError, RecursionError):  # NaN or deep nesting: no canonical JSON to sign
            continue
        num_signed += 1
        envelope = _decodes(data)
        if envelope is not None:
            assert envelope.kind == kind and envelope.author == AUTHOR
    assert num_signed > 100


def test_envelope_header_fields_of_any_value_are_a_wire_error() -> None:
    sample = json.loads(wire.sign(SEED, "claim", 1, {"term": 3}, ts=NOW))
    rng = random.Random(23)
    for _ in range(300):
        obj = _mutate(rng, sample)
        try:
            data = json.dumps(obj).encode()
        except (ValueError, RecursionError):
            continue
        _decodes(data)


def test_a_mutated_paged_request_is_a_cursor_or_a_wire_error() -> None:
    assert paging.read_cursor(b'{"cursor": 3}') == 3
    for text in json_texts(random.Random(29), b'{"cursor": 3}', 400):
        try:
            cursor = paging.read_cursor(text)
            assert isinstance(cursor, int) and cursor >= 0
        except WireError as exc:
            assert_no_slip(exc)


def test_a_mutated_sync_request_is_a_request_or_a_wire_error() -> None:
    sample = b'{"cursor": 0, "digest": null}'
    assert sync.read_request(sample).cursor == 0
    for text in json_texts(random.Random(31), sample, 400):
        try:
            assert isinstance(sync.read_request(text), SyncRequest)
        except WireError as exc:
            assert_no_slip(exc)


def test_a_mutated_rejoin_file_is_a_rejoin_or_none(tmp_path: Path) -> None:
    envelope = wire.encode(SEED, 1, RunSpec().replace(run_id="r"), run_id="r")
    peer = f"/ip4/1.2.3.4/tcp/4001/p2p/{AUTHOR}"
    sample = json.dumps({"run": envelope.decode(), "peers": [peer]}).encode()
    path = tmp_path / rejoin.FILE_NAME
    path.write_bytes(sample)
    assert rejoin.load(path, AUTHOR) is not None
    num_valid = 0
    for text in json_texts(random.Random(37), sample, 300):
        path.write_bytes(text)
        loaded = rejoin.load(path, AUTHOR)
        if loaded is not None:
            num_valid += 1
            assert isinstance(loaded[0], RunSpec)
            assert all(isinstance(p, str) for p in loaded[1].peers)
    assert num_valid < 300
