"""What one sync partner may cost us, all its pulls together (control/sync.py: SyncRound). A
hostile partner listed 4,096 keys for ~103 named pulls, each with its own 4,096 envelopes and
128 pages, filled them with stale envelopes (validly signed: a parse and a signature check
each, no blame) and had each page applied without a pause on the event loop."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.lowlevel

from p2ptrain import identity
from p2ptrain.control import sync, wire
from p2ptrain.control.intake import Intake
from p2ptrain.control.state import NodeState
from p2ptrain.records.replies import SyncPage, SyncRequest
from tests.control.test_gossip_screen import RUN_ID, Author, validate
from tests.control.test_sync_digest import client_node

HOSTILE = identity.peer_id_of(os.urandom(32))
# its page 0 lists 4,096 entries we lack: ~103 requests by name
LISTED = tuple((identity.peer_id_of(os.urandom(32)), "peer", "0" * 16) for _ in range(4096))


def stale_envelopes(count: int) -> list[str]:
    """Telemetry of throwaway authors, validly signed 100 s ago."""
    return [
        wire.sign(os.urandom(32), "telemetry", 1, {"links": {}}, time.time() - 100, RUN_ID).decode()
        for _ in range(count)
    ]


def known_record() -> tuple[NodeState, Intake, str]:
    """A client that holds an author's record, and that record (a copy is harmless)."""
    state, intake = client_node()
    author = Author()
    message = author.record()
    assert validate(state, intake, author, message)
    return state, intake, message.data.decode()


def serve(
    monkeypatch: pytest.MonkeyPatch, page: Callable[[SyncRequest], SyncPage]
) -> list[SyncRequest]:
    """Play the hostile partner: `page` answers each request; the requests, as they came."""
    requests: list[SyncRequest] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        requests.append(sync.read_request(request))
        return page(requests[-1]).to_dict()

    monkeypatch.setattr("p2ptrain.control.sync.rpc.call", call)
    return requests


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every envelope the client decodes (each copy decoded once for real: the test's own
    pace is not what is measured)."""
    decoded: list[bytes] = []
    envelopes: dict[bytes, wire.Envelope] = {}
    decode = sync.decode_pulled

    def counted(data: bytes, pace: float = 1.0) -> wire.Envelope:
        decoded.append(data)
        if data not in envelopes:
            envelopes[data] = decode(data, pace)
        return envelopes[data]

    monkeypatch.setattr(sync, "decode_pulled", counted)
    return decoded


def listing(envelopes: list[str], forever: bool = False) -> Callable[[SyncRequest], SyncPage]:
    """Pages of `envelopes`, page 0 listing LISTED; `forever`: each with a next cursor."""

    def page(asked: SyncRequest) -> SyncPage:
        nxt = asked.cursor + 1 if forever else None
        return SyncPage(tuple(envelopes), nxt, entries=LISTED if asked.digests else ())

    return page


def test_stale_envelopes_stop_the_round_after_max_unusable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, intake = client_node()
    requests = serve(monkeypatch, listing(stale_envelopes(50)))
    decoded = count_decodes(monkeypatch)
    trio.run(sync.PullSync(state, intake).sync_from, HOSTILE)
    assert len(decoded) < 104 * 50 / 4  # was 104 requests x 50
    assert len(decoded) == sync.MAX_UNUSABLE
    assert len(requests) == -(-sync.MAX_UNUSABLE // 50)
    assert state.view.penalties.score(HOSTILE) == 0  # stale: never blamed


def test_one_envelope_budget_for_every_pull_of_a_round(monkeypatch: pytest.MonkeyPatch) -> None:
    state, intake, record = known_record()
    requests = serve(monkeypatch, listing([record] * 1000))
    decoded = count_decodes(monkeypatch)
    trio.run(sync.PullSync(state, intake).sync_from, HOSTILE)
    assert len(decoded) == sync.MAX_SYNC_ENVELOPES  # was 104 requests x 1,000
    assert len(requests) == 5


def test_one_page_budget_for_every_pull_of_a_round(monkeypatch: pytest.MonkeyPatch) -> None:
    state, intake = client_node()
    requests = serve(monkeypatch, listing([], forever=True))
    trio.run(sync.PullSync(state, intake).sync_from, HOSTILE)
    assert len(requests) == sync.MAX_SYNC_PAGES  # was 128 for each of 104 pulls


def test_a_second_new_envelope_of_one_author_and_kind_in_a_round_is_not_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partner serves the latest of each (author, kind): its own record re-signed 300 times,
    each newer, is applied once, and the rest count as unusable."""
    state, intake = client_node()
    author = Author()
    assert validate(state, intake, author, author.record())
    resigned = [author.record().data.decode() for _ in range(300)]
    serve(monkeypatch, listing(resigned))
    applied: list[wire.Envelope] = []
    apply = intake.apply

    def counted(env: wire.Envelope, data: bytes, sender: str, via: str, now: float) -> bool:
        applied.append(env)
        return apply(env, data, sender, via, now)

    monkeypatch.setattr(intake, "apply", counted)
    trio.run(sync.PullSync(state, intake).sync_from, HOSTILE)
    assert len(applied) == 1  # was 300
    assert state.view.penalties.score(HOSTILE) == 0


def test_a_page_is_applied_in_slices_between_which_other_tasks_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, intake, record = known_record()
    serve(monkeypatch, lambda asked: SyncPage((record,) * 64, None))
    decoded = count_decodes(monkeypatch)
    seen_mid_page: list[int] = []

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                while True:
                    seen_mid_page.append(len(decoded))
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(watch)
            await trio.lowlevel.checkpoint()
            await sync.PullSync(state, intake).sync_from(HOSTILE)
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert len(decoded) == 64
    assert any(0 < n < 64 for n in seen_mid_page)  # was: only before and after the page


@pytest.mark.parametrize("request_bytes", [b"\xff", b"[" * 100_000, b"{", b'{"cursor": "x"}', b"7"])
def test_a_bad_sync_request_is_the_wire_error(request_bytes: bytes) -> None:
    with pytest.raises(wire.WireError):  # was a plain ValueError
        sync.read_request(request_bytes)
