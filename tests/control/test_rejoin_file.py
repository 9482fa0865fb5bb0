"""The rejoin file (control/rejoin.py) is ours, in a 0700 folder, but read like a message: only
a run spec the organiser signed counts, and a file of any other bytes is no rejoin (never an
exception out of the join)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from p2ptrain import identity
from p2ptrain.control import rejoin, wire
from p2ptrain.records import RunSpec

ORGANISER = os.urandom(32)
ORGANISER_ID = identity.peer_id_of(ORGANISER)
RUN = RunSpec().replace(run_id="kept")
PEER = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWA1111111111111111111111111111111111111111111"


def _envelope(seed: bytes) -> bytes:
    return wire.encode(seed, 1, RUN, run_id=RUN.run_id)


def test_what_is_kept_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / rejoin.FILE_NAME
    rejoin.save(path, rejoin.Rejoin(_envelope(ORGANISER), (PEER,)))
    assert rejoin.load(path, ORGANISER_ID) == (RUN, (PEER,))
    assert rejoin.load(tmp_path / "missing.json", ORGANISER_ID) is None


def test_a_run_spec_of_another_key_is_no_rejoin(tmp_path: Path) -> None:
    path = tmp_path / rejoin.FILE_NAME
    rejoin.save(path, rejoin.Rejoin(_envelope(os.urandom(32)), (PEER,)))
    assert rejoin.load(path, ORGANISER_ID) is None


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"run": 7, "peers": []}',
        b'{"peers": []}',
        json.dumps({"run": "x" * 100, "peers": ["a"]}).encode(),
        b"[" * 100_000,
        b" " * (rejoin.MAX_FILE_BYTES + 10),
    ],
)
def test_a_file_of_other_bytes_is_no_rejoin(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / rejoin.FILE_NAME
    path.write_bytes(content)
    assert rejoin.load(path, ORGANISER_ID) is None
