"""Can others dial us? Our reachability, from dial-back rounds (traversal/dialback.py), published in our
peer record (and so in `status` and the dashboard).

A round asks the bootstrap (unless we are it) and up to MAX_OTHER_SERVERS other connected
members, those that are public themselves first, all at once (`verdict_of`):
- "public" needs two independent servers that reached us on a fresh connection: the bootstrap
  (the organiser's, the one server we trust) and another peer on another network
  (address_classes.independence_key: another /24 for global addresses). One stranger saying "reached"
  would otherwise flip a NATed node to public, and it would drop its relay slots. The bootstrap
  itself needs two such others. On a swarm on one machine (all our addresses loopback) there is
  no second network: the bootstrap's word (for the bootstrap, any one server's) is enough.
- "private" when the bootstrap answered that it could not reach us, or, without its word, every
  server answered and none did, and they were two on independent networks (any two on one
  machine): one member's "no" (a stranger's, in an open run) would otherwise flip the bootstrap,
  or a node whose bootstrap is not connected, to private, and it would take relay slots (perhaps
  at that stranger's relay) and be dialled through them.
Any other round is inconclusive: the previous verdict stays ("unknown" before the first) and the
next round comes sooner. Rounds repeat every RECHECK_INTERVAL_S: a router's forwarding or a
firewall may change under a running node. (Our addresses do not: they are fixed when the node
starts listening, so a node that moved to another network is restarted, and checks anew.)
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

import trio
from libp2p.peer.id import ID

from p2ptrain.control.state import NodeState
from p2ptrain.net.address_classes import (
    LOOPBACK_KIND,
    all_loopback,
    independence_key,
    network_kind,
)
from p2ptrain.net.host import remote_ip
from p2ptrain.traversal.dialback import ask_dial_back

log = logging.getLogger(__name__)

RECHECK_INTERVAL_S = 300.0  # a verdict stands this long (a router's forwarding rarely changes)
RETRY_INTERVAL_S = 30.0  # at most, after inconclusive rounds (nobody to ask, nobody answered)
FIRST_RETRY_S = 5.0  # doubles up to RETRY_INTERVAL_S: a young swarm's second server comes soon
FIRST_ROUND_DELAY_S = 1.0  # after joining: let identify and the first gossip settle
MAX_OTHER_SERVERS = 2
SERVER_ROLES = ("trainer", "control-only", "bootstrap")


@dataclass(frozen=True)
class Opinion:
    """One server's answer in a round: did it reach us (None: no answer, or a refusal), and
    the network it answered from (independence_key of its IP as we saw it; None if unknown or
    spliced through a local route)."""

    peer: str
    network: str | None
    reached: bool | None
    is_bootstrap: bool = False


def verdict_of(opinions: Sequence[Opinion], *, am_bootstrap: bool, one_machine: bool) -> str:
    """A round's verdict (the module's docstring): public, private or unknown."""
    reached = [o for o in opinions if o.reached is True]
    networks = {o.network for o in reached if o.network is not None}
    vouched = am_bootstrap or any(o.is_bootstrap for o in reached)
    needed = 1 if one_machine else 2
    if vouched and len(networks) >= needed:
        return "public"
    if any(o.is_bootstrap and o.reached is False for o in opinions):
        return "private"
    if opinions and all(o.reached is False for o in opinions):
        networks = {o.network for o in opinions if o.network is not None}
        if len(opinions) >= 2 and (one_machine or len(networks) >= 2):
            return "private"
    return "unknown"


def server_network(server_ip: str | None, own_addrs: Sequence[str]) -> str | None:
    """Whose opinion: the network of a server we see at `server_ip`; None when we cannot tell
    (a server seen on loopback while we are not on one machine reached us through a route)."""
    if server_ip is None or network_kind(server_ip) is None:
        return None
    if network_kind(server_ip) == LOOPBACK_KIND and not all_loopback(own_addrs):
        return None
    return independence_key(server_ip)


def retry_delay_s(num_inconclusive: int) -> float:
    """When the next round comes, after this many inconclusive rounds in a row (0: a verdict)."""
    if num_inconclusive == 0:
        return RECHECK_INTERVAL_S
    return min(RETRY_INTERVAL_S, FIRST_RETRY_S * 2 ** (num_inconclusive - 1))


class ReachabilityMonitor:
    """Runs the dial-back rounds of one node and keeps NodeState.reachability."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    def servers(self) -> list[str]:
        """Whom to ask this round: the bootstrap, then up to two connected members."""
        state, view = self.state, self.state.view
        connected = {peer.to_base58() for peer in state.host.get_connected_peers()}
        first = []
        if view.bootstrap_id and view.bootstrap_id != state.peer_id:
            first = [view.bootstrap_id] if view.bootstrap_id in connected else []
        others = [
            peer
            for peer, member in list(view.members.items())
            if peer in connected
            and peer not in first
            and peer != state.peer_id
            and member.record.role in SERVER_ROLES
        ]
        random.shuffle(others)
        # a public server's outbound dial is not itself limited by a NAT of its own; one on
        # the bootstrap's network is no second opinion
        taken = {self._network(remote_ip(state.host, peer)) for peer in first}
        others.sort(
            key=lambda peer: (
                view.members[peer].record.reachability != "public",
                self._network(remote_ip(state.host, peer)) in taken,
            )
        )
        return first + others[:MAX_OTHER_SERVERS]

    async def ask(self, peer: str) -> Opinion:
        """Did `peer` reach us? None: it did not answer, or refused (rate limited, busy)."""
        is_bootstrap = peer == self.state.view.bootstrap_id
        try:
            host, addrs = self.state.host, self.state.addrs
            reply, server_ip = await ask_dial_back(host, ID.from_base58(peer), addrs)
        except Exception as exc:
            log.debug("dial-back request to %s failed: %s", peer, exc)
            return Opinion(peer, None, None, is_bootstrap)
        if reply.error:
            log.info("dial-back request to %s refused: %s", peer, reply.error)
            return Opinion(peer, None, None, is_bootstrap)
        return Opinion(peer, self._network(server_ip), reply.reached, is_bootstrap)

    def _network(self, server_ip: str | None) -> str | None:
        return server_network(server_ip, self.state.addrs)

    async def check_once(self) -> str:
        """One round: the verdict of the servers asked now."""
        servers = self.servers()
        opinions = [Opinion(peer, None, None) for peer in servers]

        async def ask(index: int) -> None:
            opinions[index] = await self.ask(servers[index])

        async with trio.open_nursery() as nursery:
            for index in range(len(servers)):
                nursery.start_soon(ask, index)
        state = self.state
        return verdict_of(
            opinions,
            am_bootstrap=state.view.bootstrap_id == state.peer_id,
            one_machine=all_loopback(state.addrs),
        )

    async def serve_reachability(self) -> None:
        """Rounds for as long as the node runs."""
        state = self.state
        await state.joined.wait()
        await trio.sleep(FIRST_ROUND_DELAY_S)
        num_inconclusive = 0
        while True:
            verdict = await self.check_once()
            if verdict != "unknown" and verdict != state.reachability:
                self._announce(verdict)
            num_inconclusive = num_inconclusive + 1 if verdict == "unknown" else 0
            await trio.sleep(retry_delay_s(num_inconclusive))

    def _announce(self, verdict: str) -> None:
        state = self.state
        if verdict == "private":
            log.warning(
                "not reachable: no peer could dial us back at %s; others cannot connect to this "
                "node (`p2ptrain doctor` says what to do; docs/operations.md, 'Behind NAT')",
                ", ".join(state.addrs) or "our addresses",
            )
        else:
            log.info("reachability: %s (was %s)", verdict, state.reachability)
        state.reachability = verdict
        state.publish_soon("record")
