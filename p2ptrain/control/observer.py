"""A light observer: a throwaway identity that asks one node for its view of the swarm."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from p2ptrain.control.rpcs import STATUS_PAGE_BYTES, STATUS_PROTOCOL
from p2ptrain.errors import UserError, WireError, first_leaf
from p2ptrain.net import rpc
from p2ptrain.net.host import make_host, parse_multiaddr, quiet_library_logs, run_trio
from p2ptrain.net.paging import checked_next, cursor_request
from p2ptrain.net.resolve import CannotResolve, connect_operator_peer
from p2ptrain.records import LinkStatus, PeerStatus, SwarmStatus
from p2ptrain.records.replies import StatusPage
from p2ptrain.records.status import MAX_STATUS_LINKS, MAX_STATUS_PEERS

OBSERVER_TIMEOUT_S = 15.0
MAX_STATUS_PAGES = 64  # 64 MiB of peers and links: a status past it is refused, not cut
# what a server that pages as ours does (rpcs.STATUS_PAGE_BYTES) sends in MAX_STATUS_PAGES pages,
# and one whole reply of slack (a page holds at least one item, whatever its size)
MAX_STATUS_BYTES = MAX_STATUS_PAGES * STATUS_PAGE_BYTES + rpc.MAX_REPLY_BYTES


async def fetch_status_doc(host: IHost, peer: ID) -> SwarmStatus:
    """The node's status document, page by page (rpcs.respond_status). Each page's items are
    validated as they arrive and the running totals bounded (MAX_STATUS_PEERS peers,
    MAX_STATUS_LINKS links, MAX_STATUS_BYTES of JSON), so a hostile node cannot make us hold 64
    pages of unchecked objects; ValueError (WireError) for a status past any of them."""
    scalars: dict[str, Any] = {}
    peers: list[PeerStatus] = []
    links: list[LinkStatus] = []
    used = 0
    cursor: int | None = 0
    for _ in range(MAX_STATUS_PAGES):
        assert cursor is not None
        reply = await rpc.call(host, peer, STATUS_PROTOCOL, cursor_request(cursor))
        page = StatusPage.from_dict(reply)
        next_page = checked_next(page.next, cursor)
        used += len(json.dumps(reply, separators=(",", ":")))
        if used > MAX_STATUS_BYTES:
            raise ValueError(f"status of more than {MAX_STATUS_BYTES} bytes")
        if len(peers) + len(page.peers) > MAX_STATUS_PEERS:
            raise ValueError(f"status of more than {MAX_STATUS_PEERS} peers")
        if len(links) + len(page.links) > MAX_STATUS_LINKS:
            raise ValueError(f"status of more than {MAX_STATUS_LINKS} links")
        if cursor == 0:
            scalars = StatusPage.scalars(reply)
        peers += [PeerStatus.from_dict(item) for item in page.peers]
        links += [LinkStatus.from_dict(item) for item in page.links]
        cursor = next_page
        if cursor is None:  # the scalars validated alone, then the checked items put in
            empty = SwarmStatus.from_dict({**scalars, "peers": [], "links": []})
            status = dataclasses.replace(empty, peers=tuple(peers), links=tuple(links))
            if (problem := status.wire_problem()) is not None:
                raise WireError(f"malformed status: {problem}")
            return status
    raise ValueError(f"status of more than {MAX_STATUS_PAGES} pages")


async def watch_status(
    node_addr: str,
    every_s: float,
    emit: Callable[[SwarmStatus | None, UserError | None], bool],
) -> None:
    """Ask the node at node_addr for its status every `every_s` seconds from one throwaway host
    (an observer's start, not each look, costs its imports and key), and hand each status, or
    why there was none, to `emit` (a failed look is tried again after `every_s`, connecting
    anew); ends when `emit` returns False."""
    quiet_library_logs(logging.CRITICAL)  # a failed dial is said once, below, in our words
    info = info_from_p2p_addr(parse_multiaddr(node_addr, need_peer_id=True))
    host = make_host(os.urandom(32), trusted=[node_addr])
    async with host.run(listen_addrs=[parse_multiaddr("/ip4/127.0.0.1/tcp/0")]):
        while True:
            try:
                looked = emit(await _look(host, info, node_addr), None)
            except UserError as error:
                looked = emit(None, error)
                # the next look dials afresh, not over what failed, and not refused at once by
                # py-libp2p's 60 s block of a peer whose dial failed (a node back from a restart)
                with trio.move_on_after(OBSERVER_TIMEOUT_S), contextlib.suppress(Exception):
                    await host.disconnect(info.peer_id)
                cache = getattr(host.get_network(), "_negative_peer_cache", None)
                if cache is not None:
                    cache.evict(str(info.peer_id))
            if not looked:
                return
            await trio.sleep(every_s)


async def _look(host: IHost, info: Any, node_addr: str) -> SwarmStatus:
    """One status document from the node, connecting first if we are not connected."""
    if not host.get_network().get_connections(info.peer_id):
        with trio.move_on_after(OBSERVER_TIMEOUT_S) as connecting:
            try:
                await connect_operator_peer(host, info)
            except CannotResolve as exc:
                raise UserError(f"cannot reach {node_addr}: {exc}") from None
            except Exception:  # py-libp2p's words for it: "no addresses established ..."
                raise UserError(
                    f"cannot reach {node_addr}: nothing there answered as that peer id (is the "
                    "node running, at that address and port, with that identity?)"
                ) from None
        if connecting.cancelled_caught:
            raise UserError(f"cannot reach {node_addr}: no answer in {OBSERVER_TIMEOUT_S:.0f} s")
    try:
        with trio.fail_after(OBSERVER_TIMEOUT_S):
            return await fetch_status_doc(host, info.peer_id)
    except (OSError, trio.TooSlowError, Exception) as exc:
        raise UserError(f"cannot get status from {node_addr}: {exc or type(exc).__name__}") from exc


async def fetch_statuses(node_addrs: list[str]) -> list[SwarmStatus | None]:
    """Ask many nodes at once from one throwaway host; None for a node that did not answer."""
    quiet_library_logs(logging.CRITICAL)
    results: list[SwarmStatus | None] = [None] * len(node_addrs)
    host = make_host(os.urandom(32), trusted=node_addrs)

    async def ask(index: int) -> None:
        info = info_from_p2p_addr(parse_multiaddr(node_addrs[index], need_peer_id=True))
        with trio.move_on_after(OBSERVER_TIMEOUT_S):
            try:
                await connect_operator_peer(host, info)
                results[index] = await fetch_status_doc(host, info.peer_id)
            except Exception:
                results[index] = None

    async with (
        host.run(listen_addrs=[parse_multiaddr("/ip4/127.0.0.1/tcp/0")]),
        trio.open_nursery() as nursery,
    ):
        for index in range(len(node_addrs)):
            nursery.start_soon(ask, index)
    return results


def get_statuses(node_addrs: list[str]) -> list[SwarmStatus | None]:
    """Blocking wrapper around fetch_statuses."""
    results: list[SwarmStatus | None] = []

    async def main() -> None:
        results.extend(await fetch_statuses(node_addrs))

    run_trio(main)
    return results


def watch(
    node_addr: str, every_s: float, emit: Callable[[SwarmStatus | None, UserError | None], bool]
) -> None:
    """Blocking wrapper around watch_status."""
    run_trio(watch_status, node_addr, every_s, emit)


def get_status(node_addr: str) -> SwarmStatus:
    """Connect to the node at node_addr (a bootstrap or any peer) and return its status document
    (validated: a node's reply is network input like any other); UserError if there is none."""
    statuses: list[SwarmStatus] = []

    def keep_first(status: SwarmStatus | None, error: UserError | None) -> bool:
        if error is not None:
            raise error
        assert status is not None
        statuses.append(status)
        return False

    try:
        run_trio(watch_status, node_addr, math.inf, keep_first)
    except* UserError as group:
        raise first_leaf(group) from None
    return statuses[0]
