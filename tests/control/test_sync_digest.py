"""Issue 29: sync by digest. A sync client sends the digests of what it holds, by bucket of
authors (control/held.py), and is served its responder's own messages plus the envelopes of
the buckets that differ only, not every held envelope (O(N) bytes every few seconds)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest
import trio
from libp2p.pubsub.pb import rpc_pb2

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.held import (
    NUM_BUCKETS,
    SMALL_BUCKET,
    HeldEnvelopes,
    bucket_of,
    fingerprint,
)
from p2ptrain.control.intake import Intake
from p2ptrain.control.state import NodeState
from p2ptrain.control.sync import PullSync, read_request
from p2ptrain.net import rpc
from p2ptrain.records import RunSpec
from p2ptrain.records.replies import SyncPage, SyncRequest
from tests.control.test_gossip_screen import Author, make_node, record_body, validate

CLIENT = identity.peer_id_of(os.urandom(32))


def served(sync: PullSync, request: SyncRequest) -> list[tuple[str, str]]:
    body = json.dumps(request.to_dict()).encode()
    page = SyncPage.from_dict(trio.run(sync.respond_sync, body))
    return [
        (e.author, e.kind) for e in (wire.decode(str(text).encode()) for text in page.envelopes)
    ]


def server_with(authors: list[Author]) -> tuple[PullSync, list[bytes]]:
    state, intake = make_node(joined=True)
    records = []
    for author in authors:
        message = author.record()
        assert validate(state, intake, author, message)
        records.append(message.data)
    return PullSync(state, intake), records


def test_a_fingerprint_is_the_body_not_the_signature_nor_the_time() -> None:
    author = Author()
    first, again = author.record(), author.record()
    changed = author.record(addrs=["/ip4/127.0.0.1/tcp/4001"])
    key = (author.id, "peer")
    assert first.data != again.data
    assert fingerprint(key, first.data) == fingerprint(key, again.data)
    assert fingerprint(key, first.data) != fingerprint(key, changed.data)
    assert fingerprint((author.id, "claim"), first.data) != fingerprint(key, first.data)


def test_digests_leave_out_telemetry_and_the_two_ends_but_not_revocation_pages() -> None:
    held, empty = HeldEnvelopes(), HeldEnvelopes().digests(())
    a, b = Author(), Author()
    held[(a.id, "telemetry")] = a.telemetry().data
    assert held.digests(()) == empty
    held[(a.id, "peer")] = a.record().data
    assert held.digests(()) != empty
    assert held.digests((a.id, b.id)) == empty
    held[(a.id, "revoked")] = a.message("revoked", {"page": 0}).data
    assert held.digests((a.id, b.id)) != empty
    assert len(empty) == NUM_BUCKETS and all(len(d) == 16 for d in empty)


def test_a_client_that_agrees_is_served_the_responders_own_messages_only() -> None:
    authors = [Author() for _ in range(40)]
    sync, _ = server_with(authors)
    everything = served(sync, SyncRequest(0, telemetry=False))
    assert len(everything) == 1 + len(authors)  # its own record, and all it holds
    client = HeldEnvelopes()
    for author in authors:  # the same records, re-signed since: the same digests
        client[(author.id, "peer")] = author.record().data
    server = sync.state.peer_id
    agreed = SyncRequest(0, False, digests=client.digests((CLIENT, server)), asker=CLIENT)
    assert served(sync, agreed) == [(server, "peer")]


def test_a_client_that_lacks_a_record_is_served_that_records_bucket_only() -> None:
    authors = [Author() for _ in range(40)]
    sync, records = server_with(authors)
    sizes = Counter(bucket_of(a.id) for a in authors)
    missing = next(a for a in authors if sizes[bucket_of(a.id)] <= SMALL_BUCKET)  # sent whole
    client = HeldEnvelopes()
    for author, data in zip(authors, records, strict=True):
        if author is not missing:
            client[(author.id, "peer")] = data
    server = sync.state.peer_id
    asked = SyncRequest(0, False, digests=client.digests((CLIENT, server)), asker=CLIENT)
    got = served(sync, asked)
    assert (missing.id, "peer") in got
    same_bucket = {(a.id, "peer") for a in authors if bucket_of(a.id) == bucket_of(missing.id)}
    assert set(got) == same_bucket | {(server, "peer")}
    assert len(got) < len(authors) // 2


def test_the_asker_is_not_served_its_own_records_and_the_audience_gets_all_telemetry() -> None:
    authors = [Author() for _ in range(5)]
    sync, records = server_with(authors)
    state, intake = sync.state, sync.intake
    assert validate(state, intake, authors[0], authors[0].telemetry())
    asker = authors[1]  # it holds the others' records, not its own
    client = HeldEnvelopes()
    for author, data in zip(authors, records, strict=True):
        if author is not asker:
            client[(author.id, "peer")] = data
    digests = client.digests((asker.id, state.peer_id))
    outsider = SyncRequest(0, False, digests=digests, asker=asker.id)
    assert served(sync, outsider) == [(state.peer_id, "peer")]
    inside = served(sync, SyncRequest(0, True, digests=digests, asker=asker.id))
    assert (authors[0].id, "telemetry") in inside and (asker.id, "peer") not in inside


def test_a_request_with_digests_is_read_or_refused_as_one_error() -> None:
    digests = ("0123456789abcdef",) * NUM_BUCKETS
    request = SyncRequest(0, digests=digests, asker=CLIENT)
    assert read_request(json.dumps(request.to_dict()).encode()) == request
    for bad in (["0123"], ["0123456789ABCDEF"], [1], "0123456789abcdef", ["g" * 16]):
        try:
            read_request(json.dumps({"cursor": 0, "digests": bad}).encode())
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was read")


def client_node(
    seed: bytes | None = None, bootstrap_id: str = "", run: RunSpec | None = None, host: Any = None
) -> tuple[NodeState, Intake]:
    """A node outside telemetry's audience, of make_node's run unless told another (a bootstrap
    and its run spec), with an identity of its own (`seed`: its host's)."""
    seed = os.urandom(32) if seed is None else seed
    state, intake = make_node(seed=seed, bootstrap_id=bootstrap_id, run=run, host=host)
    state.view.hears_telemetry = False
    return state, intake


def test_a_large_differing_bucket_is_listed_and_the_client_asks_for_what_it_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 authors: ~6 a bucket. A client that missed one record (and holds another's older
    body) is listed those buckets' entries, asks for the two by name, and holds what the
    server holds afterwards, moving a fraction of the server's records."""
    authors = [Author() for _ in range(200)]
    sizes = Counter(bucket_of(a.id) for a in authors)
    missing, changed = [a for a in authors if sizes[bucket_of(a.id)] > SMALL_BUCKET][:2]
    older = changed.message("peer", {**record_body(changed.token.encode()), "version": "9"})
    sync, records = server_with(authors)  # the server holds `changed`'s newer record
    client, client_intake = client_node()
    for author, data in zip(authors, records, strict=True):
        if author is missing:
            continue
        if author is changed:
            assert validate(client, client_intake, author, older)
            continue
        assert validate(client, client_intake, author, author_message(author, data))
    moved: list[int] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        reply = await sync.respond_sync(request)
        moved.append(len(json.dumps(reply)))
        return reply

    monkeypatch.setattr("p2ptrain.control.sync.rpc.call", call)
    trio.run(PullSync(client, client_intake).sync_from, sync.state.peer_id)
    server_id = sync.state.peer_id
    ends = (client.peer_id, server_id)
    assert client.latest.digests(ends) == sync.state.latest.digests(ends)
    assert len(moved) == 2  # the digests' page, then the two records by name
    assert sum(moved) < sum(len(r) for r in records) / 4


def test_a_request_for_keys_is_served_exactly_those() -> None:
    authors = [Author() for _ in range(10)]
    sync, _ = server_with(authors)
    named = ((authors[2].id, "peer"), (authors[5].id, "peer"), ("nobody", "peer"))
    got = served(sync, SyncRequest(0, False, keys=named))
    assert sorted(got) == sorted(named[:2])  # not the responder's own, not what it lacks


def author_message(author: Author, data: bytes) -> rpc_pb2.Message:
    """`data`, an envelope `author` signed, as a gossip message from it."""
    message = author.record()
    message.data = data
    return message


def test_many_records_lacked_are_named_in_requests_that_fit_the_rpc_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    authors = [Author() for _ in range(400)]  # ~12 a bucket
    sync, records = server_with(authors)
    client, client_intake = client_node()
    lacked = {b for b in range(NUM_BUCKETS) if b % 7 == 0}  # 5 buckets: ~60 records
    for author, data in zip(authors, records, strict=True):
        if bucket_of(author.id) not in lacked:
            assert validate(client, client_intake, author, author_message(author, data))
    requests: list[bytes] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        requests.append(request)
        return await sync.respond_sync(request)

    monkeypatch.setattr("p2ptrain.control.sync.rpc.call", call)
    trio.run(PullSync(client, client_intake).sync_from, sync.state.peer_id)
    ends = (client.peer_id, sync.state.peer_id)
    assert client.latest.digests(ends) == sync.state.latest.digests(ends)
    assert len(requests) >= 3 and all(len(r) <= rpc.MAX_REQUEST_BYTES for r in requests)
