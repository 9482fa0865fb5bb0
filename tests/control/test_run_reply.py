"""RUN_PROTOCOL's answer (control/rpcs.py): the bootstrap signs the run afresh; a joined member
sends the latest run envelope the organiser published that it holds, or the one it joined with,
so a new node can join through it while the bootstrap is down (control/rejoin.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from p2ptrain import identity
from p2ptrain.control import rejoin, rpcs, wire
from p2ptrain.records import RunSpec
from p2ptrain.records.replies import RunReply
from tests.control.test_gossip_screen import ORGANISER, RUN_ID, make_node


def _reply(state: object) -> RunReply:
    return RunReply.from_dict(trio.run(rpcs.RpcResponder(state).respond_run, b""))  # type: ignore[arg-type]


def test_a_member_answers_with_the_organisers_run_once_joined() -> None:
    state, _ = make_node()
    assert _reply(state).envelope is None  # not joined: nothing to vouch for
    state.joined.set()
    assert _reply(state).envelope is None  # joined, but no envelope of the organiser held
    run = RunSpec().replace(run_id=RUN_ID)
    joined_with = wire.encode(ORGANISER, 1, run, run_id=RUN_ID)
    state.run_envelope = joined_with
    assert _reply(state).envelope == joined_with.decode()
    published = wire.encode(ORGANISER, 2, run, run_id=RUN_ID)
    state.latest[(identity.peer_id_of(ORGANISER), "run")] = published
    reply = _reply(state)
    assert reply.envelope == published.decode()  # the latest held wins
    organiser = identity.peer_id_of(ORGANISER)
    assert rejoin.checked_run(reply.to_dict(), organiser, rejoin.MAX_RUN_AGE_S)[0] == run


def test_what_a_member_forges_is_refused_by_the_joiner() -> None:
    state, _ = make_node(joined=True)
    state.run_envelope = wire.encode(os.urandom(32), 1, RunSpec(), run_id=RUN_ID)
    reply = _reply(state)
    assert reply.envelope is not None
    organiser = identity.peer_id_of(ORGANISER)
    with pytest.raises(wire.WireError, match="forged"):
        rejoin.checked_run(reply.to_dict(), organiser, rejoin.MAX_RUN_AGE_S)


class _NoPeers:
    def get_connected_peers(self) -> list[object]:
        return []


def test_the_kept_file_holds_the_newest_run_envelope(tmp_path: Path) -> None:
    """It held the envelope the node joined with, which aged towards the kept file's 30-day
    limit though gossip brought a fresh one every few seconds."""
    state, _ = make_node(joined=True, host=_NoPeers())
    run = RunSpec().replace(run_id=RUN_ID)
    state.run_envelope = wire.encode(ORGANISER, 1, run, run_id=RUN_ID, ts=time.time() - 86400)
    fresh = wire.encode(ORGANISER, 2, run, run_id=RUN_ID)
    state.latest[(identity.peer_id_of(ORGANISER), "run")] = fresh
    path = tmp_path / rejoin.FILE_NAME
    rejoin.keep(state, path)
    loaded = rejoin.load(path, identity.peer_id_of(ORGANISER))
    assert loaded is not None and loaded[1].run_envelope == fresh
