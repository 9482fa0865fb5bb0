"""Issue 11, attack 8: sync and status replies were cut at 4 MiB into invalid JSON. Both are paged
now; a view holding far more than 4 MiB arrives whole over live hosts (one trio loop, loopback)."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.links import MAX_ROW_ENTRIES
from p2ptrain.control.node import ControlNode, NodeConfig
from p2ptrain.control.observer import fetch_status_doc
from p2ptrain.control.rpcs import STATUS_PROTOCOL
from p2ptrain.control.status import swarm_status
from p2ptrain.control.view import Member
from p2ptrain.net import rpc
from p2ptrain.net.host import make_host
from p2ptrain.net.paging import page_of
from p2ptrain.records import LinkReport, PeerRecord, RunSpec, Telemetry

NUM_AUTHORS = 80
NUM_LINKS = 450  # ~60 KiB of telemetry per author: 80 of them are ~5 MiB


def _node(role: str, bootstrap_addr: str | None = None) -> ControlNode:
    config = NodeConfig(
        seed=os.urandom(32),
        role=role,
        run=RunSpec(),
        print_addr=False,
        bootstrap_addr=bootstrap_addr,
    )
    return ControlNode(config)


def _record() -> PeerRecord:
    return PeerRecord(
        addrs=(),
        data_addrs=(),
        role="control-only",
        planner_capable=False,
        version="0",
        hardware={},
    )


def _run(scenario: Any) -> None:
    try:
        trio.run(scenario)
    except* RuntimeError as group:  # py-libp2p's teardown race, after the results are in
        if not all("Nursery is closed" in str(e) for e in group.exceptions):
            raise


@asynccontextmanager
async def serving(server: ControlNode, client: Any) -> AsyncIterator[None]:
    """`server` running and the `client` host connected to it, both on loopback; the body
    runs within 30 s, then both stop."""
    async with (
        trio.open_nursery() as nursery,
        client.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]),
    ):
        await nursery.start(server.run)
        with trio.fail_after(30):
            await client.connect(info_from_p2p_addr(Multiaddr(server.addrs[0])))
            yield
        nursery.cancel_scope.cancel()


def test_page_of_keeps_items_whole_and_always_makes_progress() -> None:
    items = ["x" * 10, "y" * 100, "z" * 10]
    assert page_of(items, 0, 30) == (["x" * 10], 1)
    assert page_of(items, 1, 30) == (["y" * 100], 2)  # larger than the budget: alone
    assert page_of(items, 2, 30) == (["z" * 10], None)
    assert page_of([], 0, 30) == ([], None)


def test_a_sync_of_more_than_4_mib_arrives_whole() -> None:
    server = _node("bootstrap")
    others = [identity.peer_id_of(os.urandom(32)) for _ in range(NUM_LINKS)]
    row = {peer: LinkReport(1.5, 0.5, 800.0, 0.5) for peer in others}
    authors = [os.urandom(32) for _ in range(NUM_AUTHORS)]
    signed_at = time.monotonic()
    for seed in authors:
        author = identity.peer_id_of(seed)
        server.state.latest[(author, "peer")] = wire.encode(seed, 1, _record())
        server.state.latest[(author, "telemetry")] = wire.encode(seed, 2, Telemetry(row, None))
    held_bytes = sum(len(d) for d in server.state.latest.values())
    assert held_bytes > rpc.MAX_REPLY_BYTES  # what used to be cut into invalid JSON
    nodes: list[ControlNode] = []

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            client = _node("control-only", server.addrs[0])
            client.view.hears_telemetry = True  # a candidate's view: every member's telemetry
            nodes.append(client)
            await nursery.start(client.run)
            with trio.fail_after(30):
                await client.state.joined.wait()
                await client.sync.sync_from(server.peer_id)
            nursery.cancel_scope.cancel()

    _run(scenario)
    client = nodes[0]
    got = {identity.peer_id_of(seed) for seed in authors} & set(client.view.members)
    assert len(got) == NUM_AUTHORS
    # every row arrived: whole while the swarm seemed a full mesh, else kept to MAX_ROW_ENTRIES
    # (control/links.py)
    kept = (NUM_LINKS, MAX_ROW_ENTRIES)
    assert all(len(client.view.links.rows[peer][0]) in kept for peer in got)
    assert all(client.view.penalties.score(peer) == 0 for peer in got)
    # heard when they were signed (a loaded box may take longer than DEAD_AFTER_S to sync)
    assert all(client.view.members[p].last_heard >= signed_at - 1.0 for p in got)


def test_a_status_of_more_than_4_mib_arrives_whole() -> None:
    server = _node("bootstrap")
    view, now = server.view, time.monotonic()
    members = sorted(identity.peer_id_of(os.urandom(32)) for _ in range(320))
    for peer in members:
        view.members[peer] = Member(_record(), now)
    for peer in members:  # every pair measured: ~51,000 links
        view.links.rows[peer] = (
            {p: LinkReport(1.0, 0.5, 900.0, 0.5) for p in members if p > peer},
            now,
        )
    whole = swarm_status(view, now).to_dict()
    status: list[Any] = []

    async def scenario() -> None:
        observer = make_host(os.urandom(32))
        async with serving(server, observer):
            first = await rpc.call(observer, ID.from_base58(server.peer_id), STATUS_PROTOCOL)
            status.append(first)
            status.append(await fetch_status_doc(observer, ID.from_base58(server.peer_id)))

    _run(scenario)
    first_page, doc = status
    assert len(str(whole)) > rpc.MAX_REPLY_BYTES and first_page["next"] is not None
    assert len(doc.peers) == len(members) and len(doc.links) == len(whole["links"])
    assert [p.id for p in doc.peers] == members
    assert {(x.a, x.b) for x in doc.links} == {(x["a"], x["b"]) for x in whole["links"]}
