"""Can others dial us? Our reachability, from dial-back rounds (net/dialback.py), published in our
peer record (and so in `status` and the dashboard).

A round asks the bootstrap (unless we are it) and up to MAX_OTHER_SERVERS other connected
members, those that are public themselves first, all at once. The verdict is "public" if any
of them reached us on a fresh connection, "private" if every one answered and none did; any
other round is inconclusive: the previous verdict stays ("unknown" before the first) and the
next round comes sooner. Rounds repeat every RECHECK_INTERVAL_S: a router's forwarding or a
firewall may change under a running node. (Our addresses do not: they are fixed when the node
starts listening, so a node that moved to another network is restarted, and checks anew.)
"""

from __future__ import annotations

import logging
import random

import trio
from libp2p.peer.id import ID

from p2ptrain.control.state import NodeState
from p2ptrain.net.dialback import reachability_of, request_dial_back

log = logging.getLogger(__name__)

RECHECK_INTERVAL_S = 300.0  # a verdict stands this long (a router's forwarding rarely changes)
RETRY_INTERVAL_S = 30.0  # after an inconclusive round (nobody to ask, nobody answered)
FIRST_ROUND_DELAY_S = 1.0  # after joining: let identify and the first gossip settle
MAX_OTHER_SERVERS = 2
SERVER_ROLES = ("trainer", "control-only", "bootstrap")


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
        # a public server's outbound dial is not itself limited by a NAT of its own
        others.sort(key=lambda peer: view.members[peer].record.reachability != "public")
        return first + others[:MAX_OTHER_SERVERS]

    async def ask(self, peer: str) -> bool | None:
        """Did `peer` reach us? None: it did not answer, or refused (rate limited, busy)."""
        try:
            reply = await request_dial_back(self.state.host, ID.from_base58(peer), self.state.addrs)
        except Exception as exc:
            log.debug("dial-back request to %s failed: %s", peer, exc)
            return None
        if reply.error:
            log.info("dial-back request to %s refused: %s", peer, reply.error)
            return None
        return reply.reached

    async def check_once(self) -> str:
        """One round: the verdict of the servers asked now."""
        servers = self.servers()
        outcomes: list[bool | None] = [None] * len(servers)

        async def ask(index: int) -> None:
            outcomes[index] = await self.ask(servers[index])

        async with trio.open_nursery() as nursery:
            for index in range(len(servers)):
                nursery.start_soon(ask, index)
        return reachability_of(outcomes)

    async def serve_reachability(self) -> None:
        """Rounds for as long as the node runs."""
        state = self.state
        await state.joined.wait()
        await trio.sleep(FIRST_ROUND_DELAY_S)
        while True:
            verdict = await self.check_once()
            if verdict != "unknown" and verdict != state.reachability:
                self._announce(verdict)
            await trio.sleep(RETRY_INTERVAL_S if verdict == "unknown" else RECHECK_INTERVAL_S)

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
