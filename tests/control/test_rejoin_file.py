"""The rejoin file (control/rejoin.py) is ours, in a 0700 folder, but read like a message: only
a run spec the organiser signed counts, and a file of any other bytes is no rejoin (never an
exception out of the join)."""

from __future__ import annotations

import json
import os
import time
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
    loaded = rejoin.load(path, ORGANISER_ID)
    assert loaded is not None and loaded[0] == RUN and loaded[1].peers == (PEER,)
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


def test_a_run_reply_counts_only_when_the_organiser_signed_it() -> None:
    """What a member sends a joiner while the bootstrap is down: it can refuse, not change the
    run (its own signed run spec, or a reply of other bytes, is refused)."""
    body, envelope = rejoin.checked_run({"envelope": _envelope(ORGANISER).decode()}, ORGANISER_ID)
    assert body == RUN and wire.decode(envelope).author == ORGANISER_ID
    for reply in (
        {"envelope": _envelope(os.urandom(32)).decode()},
        {"error": "not in a run yet"},
        {"envelope": "x"},
        [],
        {"envelope": 7},
    ):
        with pytest.raises(wire.WireError):
            rejoin.checked_run(reply, ORGANISER_ID)
    with pytest.raises(wire.WireError):  # nobody's word counts for a node without an organiser
        rejoin.checked_run({"envelope": _envelope(ORGANISER).decode()}, None)


def test_a_members_run_spec_may_be_as_old_as_a_kept_one() -> None:
    """The bootstrap signs its reply afresh; a member's is the latest the organiser published,
    as old as the bootstrap's absence: taken up to MAX_RUN_AGE_S when joining through it."""
    old = wire.encode(ORGANISER, 1, RUN, run_id=RUN.run_id, ts=time.time() - 3600)
    with pytest.raises(wire.WireError):
        rejoin.checked_run({"envelope": old.decode()}, ORGANISER_ID)
    assert rejoin.checked_run({"envelope": old.decode()}, ORGANISER_ID, rejoin.MAX_RUN_AGE_S)[0]
