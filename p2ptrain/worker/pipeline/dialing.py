"""Dialling the plan's peers through p2pd (the Transport's connections, worker/pipeline/transport.py):
one peer's dial within its window, and keeping up the connections reached through a local route.
Everything here runs on the transport's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping, Sequence

from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

log = logging.getLogger(__name__)

YIELD_DIAL_S = (2.0, 3.0)  # how long the larger peer id leaves the dial to the other one
ROUTE_CHECK_S = 2.0  # how often routed peers' connections are checked (keep_routes)


def transport_addrs(maddrs: Sequence[str]) -> list[Multiaddr]:
    """The addresses p2pd dials for a peer's multiaddrs: each without its trailing /p2p/<id>.
    One the parser refuses is left out: records check every address (records/multiaddrs.py),
    but a dial must never be where a bad one ends the worker."""
    addrs = []
    for text in maddrs:
        try:
            addrs.append(Multiaddr(text.split("/p2p/")[0]))
        except Exception as exc:  # multiaddr raises several unrelated types
            log.warning("not dialling %r: %s", text[:100], exc)
    return addrs


async def connect(
    p2p: P2P, own_id: str, peer_id: str, maddrs: Sequence[str], window_s: float
) -> bool:
    """Dial `peer_id` at `maddrs` from `own_id` (ours) until connected or `window_s` has
    passed; whether it is."""
    loop = asyncio.get_running_loop()
    addrs = transport_addrs(maddrs)
    if not addrs:
        log.warning("no address of %s to dial: %s", peer_id, list(maddrs)[:4])
        return False
    deadline = loop.time() + window_s
    problem = ""
    # Two peers of a new plan dial each other at once; over long round trips both Noise
    # handshakes can fail ("message is too short"), and p2pd then refuses new dials for a
    # while ("dial backoff", 5 s and growing). So the smaller peer id dials first; the other
    # waits a little (its connect then finds the connection up), and random pauses break
    # any tie left. We keep trying past the backoff.
    if own_id > peer_id:
        await _wait_dialled_by(p2p, peer_id, random.uniform(*YIELD_DIAL_S))
    while loop.time() < deadline:
        try:
            await p2p._client.connect(PeerID.from_base58(peer_id), addrs)
            return True
        except Exception as exc:  # p2pd reports failures as ControlFailure and others
            problem = repr(exc)[-200:]
        await asyncio.sleep(random.uniform(0.5, 2.0))
    log.warning("could not connect to %s in %.0f s: %s", peer_id, window_s, problem)
    return False


async def keep_routes(p2p: P2P, routes: Callable[[], Mapping[str, list[Multiaddr]]]) -> None:
    """Forever: every ROUTE_CHECK_S, re-dial each of `routes()` whose connection dropped."""
    while True:
        await asyncio.sleep(ROUTE_CHECK_S)
        with contextlib.suppress(Exception):
            connected = {info.peer_id for info in await p2p.list_peers()}
            for peer, addrs in list(routes().items()):
                peer_id = PeerID.from_base58(peer)
                if peer_id not in connected:
                    with contextlib.suppress(Exception):
                        await p2p._client.connect(peer_id, addrs)


async def _wait_dialled_by(p2p: P2P, peer_id: str, timeout_s: float) -> None:
    """Return once the peer connected to us, or after timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    wanted = PeerID.from_base58(peer_id)
    while loop.time() < deadline:
        with contextlib.suppress(Exception):
            if any(info.peer_id == wanted for info in await p2p.list_peers()):
                return
        await asyncio.sleep(0.1)
