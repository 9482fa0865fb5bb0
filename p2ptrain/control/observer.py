"""A light observer: a throwaway identity that asks one node for its view of the swarm."""

from __future__ import annotations

import os
from typing import Any

import trio
from libp2p.peer.peerinfo import info_from_p2p_addr

from p2ptrain.control.node import STATUS_PROTOCOL
from p2ptrain.errors import UserError
from p2ptrain.net import rpc
from p2ptrain.net.host import make_host, parse_multiaddr, quiet_library_logs

OBSERVER_TIMEOUT_S = 15.0


async def fetch_status(node_addr: str) -> dict[str, Any]:
    """Connect to the node at node_addr (a bootstrap or any peer) and return its status document."""
    quiet_library_logs()
    info = info_from_p2p_addr(parse_multiaddr(node_addr, need_peer_id=True))
    host = make_host(os.urandom(32))
    async with host.run(listen_addrs=[parse_multiaddr("/ip4/127.0.0.1/tcp/0")]):
        try:
            with trio.fail_after(OBSERVER_TIMEOUT_S):
                await host.connect(info)
                status: dict[str, Any] = await rpc.call(host, info.peer_id, STATUS_PROTOCOL)
        except (OSError, trio.TooSlowError, Exception) as exc:
            raise UserError(
                f"cannot get status from {node_addr}: {exc or type(exc).__name__}"
            ) from exc
    return status


def get_status(node_addr: str) -> dict[str, Any]:
    """Blocking wrapper around fetch_status."""
    result: dict[str, Any] = {}

    async def main() -> None:
        result.update(await fetch_status(node_addr))

    try:
        trio.run(main)
    except* UserError as group:
        raise group.exceptions[0] from None
    except* RuntimeError as group:  # py-libp2p teardown race
        if not all("Nursery is closed" in str(e) for e in group.exceptions):
            raise
    return result
