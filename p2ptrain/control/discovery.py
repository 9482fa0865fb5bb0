"""Finding the swarm and staying connected to it, through the bootstrap and the Kademlia DHT.

Joining: connect to the bootstrap (with backoff), fetch its signed run spec over RUN_PROTOCOL,
add it to the DHT. Then, every few seconds, dial the members we know of (gossiped records, the DHT
routing table) but are not connected to; now and then refresh the routing table; and keep our
signed record in the DHT under /p2ptrain/peer/<id> (the bootstrap also keeps the run spec under
/p2ptrain/run).

The addresses a member declares are its word, not a target: otherwise free identities could
make the whole swarm a reflector aimed at anyone. So a dial goes to one of at most
MAX_ADDRS_PER_PEER addresses of a peer, those we saw it connect from first; only to addresses
address_classes.may_dial accepts (global ones, or loopback / a private network only when one of ours is
of the same kind, and within it only a subnet or route of this machine: net/own_networks.py;
never link-local, multicast, unspecified or reserved); never to a DNS name a
peer declares (its resolution may point anywhere, and change: a node that wants to be dialled
announces its IPs; the bootstrap's address, the operator's, may be a name). And all dials share
one budget: each endpoint at most once per DIAL_WINDOW_S whichever peers name it, and at most
DIALS_PER_WINDOW in all (py-libp2p retries a failed dial up to 3 times: 4 connection attempts).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from libp2p.abc import IPeerStore
from libp2p.kad_dht.kad_dht import KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.peer.peerstore import PeerStoreError
from multiaddr import Multiaddr

from p2ptrain.control import rejoin
from p2ptrain.control.authored import record_message, run_message
from p2ptrain.control.dht_store import RUN_KEY, own_operation, peer_key
from p2ptrain.control.rpcs import RUN_PROTOCOL
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import MEMBER_ROLES
from p2ptrain.errors import UserError
from p2ptrain.net import dial_gate, rpc
from p2ptrain.net.address_classes import ip_of, may_dial, own_ips
from p2ptrain.net.host import parse_multiaddr, remote_ip
from p2ptrain.net.own_networks import machine_networks
from p2ptrain.net.ratelimit import WindowLimiter
from p2ptrain.net.resolve import connect_operator_peer
from p2ptrain.records import token_problem

log = logging.getLogger(__name__)

DHT_TIMEOUT_S = 10.0  # one routing-table refresh or one put
# members come from gossip, not the routing table: the refresh only keeps the DHT answering, and
# each one queries a dozen peers (py-spy, 12 control-only peers: ~12% of a member's CPU at 30 s).
# Each node refreshes at its own random times (DHT_REFRESH_INTERVAL_S x 0.5-1.5 apart, the first
# within one interval of joining, not at once): 32 peers started together refreshed together, a
# burst of 32 x 32 queries every 2 minutes (14% of a member's profile over 40 s of the 32-peer test)
DHT_REFRESH_INTERVAL_S = 300.0
DHT_PUT_INTERVAL_S = 600.0  # a put record lives DHT_RECORD_MAX_AGE_S
DISCOVERY_INTERVAL_S = 3.0
CONNECT_TIMEOUT_S = 5.0
REDIAL_BACKOFF_S = 10.0
JOIN_RETRY_FIRST_S = 0.5  # doubles up to JOIN_RETRY_MAX_S while the bootstrap is unreachable
JOIN_RETRY_MAX_S = 5.0
PEERSTORE_TTL_S = 3600
MAX_ADDRS_PER_PEER = 2  # the addresses of one peer we ever try, in turn
DIALS_PER_WINDOW = 16  # new dials per window, all peers together: 1,000 Sybils get no more
DIAL_WINDOW_S = 10.0  # and the host's dial gate rates every dial, any library's (net/dial_gate.py)


def _known_addrs(peerstore: IPeerStore, peer_id: ID) -> list[str]:
    try:
        return [str(addr) for addr in peerstore.addrs(peer_id)]
    except PeerStoreError:  # never heard of, or expired
        return []


def _parsed(addr: str) -> Multiaddr | None:
    """`addr` as py-libp2p dials it, or None: a record's addresses are checked on arrival
    (records/multiaddrs.py), but one the parser refuses must cost a dial, not the process."""
    try:
        return Multiaddr(addr)
    except Exception as exc:  # multiaddr raises several unrelated types
        log.debug("not dialling %r: %s", addr[:100], exc)
        return None


class Discovery:
    """Joins through the bootstrap, then keeps dialling known members and our DHT record fresh."""

    def __init__(
        self,
        state: NodeState,
        dht: KadDHT,
        bootstrap_addr: str | None,
        pin_route: Callable[[str], Awaitable[bool]] | None = None,
        rejoin_path: Path | None = None,
        via: tuple[str, ...] = (),
    ) -> None:
        """pin_route(peer): leave only a local route to `peer` in the peerstore, if it is
        reached through one (control/traversal.py); True if so. rejoin_path: where this node
        keeps what a restarted control process rejoins from (control/rejoin.py). via: members'
        full multiaddrs (the operator's `--via`) to join through while the bootstrap is down."""
        self.state = state
        self.rejoin_path = rejoin_path
        self.via = tuple(info_from_p2p_addr(parse_multiaddr(a, need_peer_id=True)) for a in via)
        for addr in via:
            dial_gate.trust(state.host, addr)  # the operator's word, as the bootstrap's is
        self.dht = dht
        self.pin_route = pin_route
        self.bootstrap: PeerInfo | None = None  # None on the bootstrap itself
        if bootstrap_addr:
            self.bootstrap = info_from_p2p_addr(parse_multiaddr(bootstrap_addr, need_peer_id=True))
            state.view.bootstrap_id = self.bootstrap.peer_id.to_base58()
            dial_gate.trust(state.host, bootstrap_addr)  # the operator's word, whatever it names
        elif state.role == "bootstrap":
            state.view.bootstrap_id = state.peer_id
        self._last_dial: dict[str, float] = {}
        self._num_dials: dict[str, int] = {}  # peer -> dials so far: which address is next
        self._seen_ips: dict[str, set[str]] = {}  # peer -> IPs its connections came from
        self._noted: set[str] = set()  # connected members whose connection's IP we noted
        # key = the endpoint dialled: at most once a window, however many records name it
        self.budget = WindowLimiter(1, DIALS_PER_WINDOW, DIAL_WINDOW_S)

    async def join(self) -> None:
        """Connect to the bootstrap and learn the run from it (retrying until it answers), then
        set `joined`. The bootstrap is joined at once."""
        if self.bootstrap is None:
            self.state.joined.set()
            return
        info = self.bootstrap
        delay_s = JOIN_RETRY_FIRST_S
        for attempt in itertools.count(1):
            try:
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    await connect_operator_peer(self.state.host, info)
                await self._fetch_run()
                break
            except Exception as exc:
                log.warning("cannot reach bootstrap %s yet: %s", info.peer_id, exc or type(exc))
                if attempt >= rejoin.JOIN_ATTEMPTS and await self._join_without_bootstrap():
                    return
                await trio.sleep(delay_s)
                delay_s = min(delay_s * 2, JOIN_RETRY_MAX_S)
        self._check_admission()
        await self.dht.add_peer(info.peer_id)
        log.info(
            "joined via bootstrap %s, run %s",
            info.peer_id,
            self.state.view.run.run_id if self.state.view.run else None,
        )
        self.state.joined.set()

    async def _join_without_bootstrap(self) -> bool:
        """The bootstrap is unreachable: rejoin from what this node kept (a restarted control
        process), else join through a member the operator named (`--via`); True if joined."""
        if not await rejoin.from_kept(self.state, self.rejoin_path):
            member = await rejoin.through_members(self.state, self.via)
            if member is None:
                return False
            await self.dht.add_peer(member)
        self._check_admission()
        self.state.joined.set()
        return True

    def _check_admission(self) -> None:
        """A run that admits token holders only: without a valid token of ours, we leave (the
        others would ignore us anyway) with one line saying why."""
        view = self.state.view
        if view.run is None or view.run.swarm.admission != "token":
            return
        token = view.authority.own_token
        problem = (
            "no token (join --token)"
            if token is None
            else token_problem(
                token, view.bootstrap_id, self.state.peer_id, time.time(), view.run.run_id
            )
        )
        if problem is not None:
            raise UserError(
                f"run {view.run.run_id} admits holders of the organiser's tokens only, and our "
                f"token is refused: {problem}; send the organiser our peer id "
                f"({self.state.peer_id}, `p2ptrain id`)"
            )

    async def _fetch_run(self) -> None:
        assert self.bootstrap is not None
        view = self.state.view
        reply = await rpc.call(self.state.host, self.bootstrap.peer_id, RUN_PROTOCOL)
        view.run, self.state.run_envelope = rejoin.checked_run(reply, view.bootstrap_id)

    async def _refresh_dht(self) -> None:
        with trio.move_on_after(DHT_TIMEOUT_S):
            try:
                await self.dht.refresh_routing_table()
            except Exception as exc:
                log.info("DHT refresh failed: %s", exc)

    async def serve_discovery(self) -> None:
        """Dial members we know of (gossiped records, DHT routing table) but are not connected to."""
        state = self.state
        await state.joined.wait()
        last_put = time.monotonic()
        next_refresh = last_put + DHT_REFRESH_INTERVAL_S * random.random()
        await self._put_record_in_dht()
        last_kept = -math.inf
        while True:
            await trio.sleep(DISCOVERY_INTERVAL_S)
            await self.dial_round()
            now = time.monotonic()
            if now - last_kept >= rejoin.SAVE_INTERVAL_S:
                last_kept = now
                rejoin.keep(self.state, self.rejoin_path)
            if now >= next_refresh:
                next_refresh = now + DHT_REFRESH_INTERVAL_S * random.uniform(0.5, 1.5)
                await self._refresh_dht()
            if now - last_put > DHT_PUT_INTERVAL_S:
                last_put = now
                await self._put_record_in_dht()

    async def dial_round(self) -> None:
        """Dial, within the budget, the peers we know of and are not connected to."""
        state, now = self.state, time.monotonic()
        connected = {p.to_base58() for p in state.host.get_connected_peers()}
        self._note_seen(connected)
        wanted = set()
        for peer, member in list(state.view.members.items()):
            if member.record.role not in MEMBER_ROLES and peer != state.view.bootstrap_id:
                continue
            if peer in connected or now - self._last_dial.get(peer, -1e9) < REDIAL_BACKOFF_S:
                continue
            wanted.add(peer)
        routed = {peer_id.to_base58() for peer_id in self.dht.routing_table.get_peer_ids()}
        for peer in routed:
            if peer not in connected and now - self._last_dial.get(peer, -1e9) >= REDIAL_BACKOFF_S:
                wanted.add(peer)
        wanted.discard(state.peer_id)
        known = set(state.view.members) | routed | connected
        for memory in (self._last_dial, self._num_dials):
            for peer in [p for p in memory if p not in known]:
                del memory[peer]
        if wanted:
            async with trio.open_nursery() as nursery:
                for peer in wanted:
                    self._last_dial[peer] = now
                    nursery.start_soon(self._dial, peer)

    def _note_seen(self, connected: set[str]) -> None:
        """Remember where connected members' connections come from: their likeliest address.
        A member's connection is read once, when we first see it connected (a read decodes its
        peer id: every connection every round was 3.5% of a member's CPU at 32 peers)."""
        members = self.state.view.members
        self._noted &= connected  # one that reconnects is read again
        for peer in connected - self._noted:
            ip = remote_ip(self.state.host, peer) if peer in members else None
            if ip is None:
                continue
            self._noted.add(peer)
            seen = self._seen_ips.setdefault(peer, set())
            if len(seen) < MAX_ADDRS_PER_PEER:
                seen.add(ip)
        for peer in [p for p in self._seen_ips if p not in members]:
            del self._seen_ips[peer]

    def candidates(self, peer: str, declared: list[str]) -> list[str]:
        """The addresses of `peer` we may dial (module docstring), at most MAX_ADDRS_PER_PEER,
        those on an IP we saw it on first (the bootstrap is dialled at the operator's address:
        _dial_bootstrap)."""
        ours, nets = own_ips(self.state.addrs), machine_networks()
        allowed = [a for a in declared if (ip := ip_of(a)) is not None and may_dial(ip, ours, nets)]
        seen = self._seen_ips.get(peer, set())
        allowed.sort(key=lambda addr: ip_of(addr) not in seen)  # stable: the record's order
        return list(dict.fromkeys(a.split("/p2p/")[0] for a in allowed))[:MAX_ADDRS_PER_PEER]

    async def _pinned(self, peer: str) -> bool:
        """pin_route, whose failure costs this dial only, never discovery."""
        assert self.pin_route is not None
        try:
            return await self.pin_route(peer)
        except Exception as exc:
            log.info("no route to %s: %s", peer, exc)
            return False

    async def _dial(self, peer: str) -> None:
        peer_id = ID.from_base58(peer)
        peerstore = self.state.host.get_peerstore()
        if self.pin_route is not None and await self._pinned(peer):
            # behind NATs both: a local route of ours (control/traversal.py) stands in for it
            addrs = _known_addrs(peerstore, peer_id)
        elif self.bootstrap is not None and peer_id == self.bootstrap.peer_id:
            await self._dial_bootstrap()
            return
        else:
            member = self.state.view.members.get(peer)
            declared = list(member.record.addrs) if member is not None else []
            declared += _known_addrs(peerstore, peer_id)  # the DHT's, identify's
            addrs = self.candidates(peer, declared)
        if not addrs:
            return
        num = self._num_dials.get(peer, 0)
        addr = addrs[num % len(addrs)]
        maddr = _parsed(addr)
        if maddr is None:
            self._num_dials[peer] = num + 1  # the next round tries its next address
            return
        if not self.budget.allow(addr, time.monotonic()):
            return
        self._num_dials[peer] = num + 1
        # the peerstore is what py-libp2p dials, from here and from any other caller: leave only
        # the address we chose there
        peerstore.clear_addrs(peer_id)
        peerstore.add_addrs(peer_id, [maddr], PEERSTORE_TTL_S)
        cache = getattr(self.state.host.get_network(), "_negative_peer_cache", None)
        if cache is not None and len(addrs) > 1:
            cache.evict(
                peer
            )  # py-libp2p blocks a peer 60 s after a failed dial: not its other address
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            try:
                await self.state.host.connect(PeerInfo(peer_id, [maddr]))
            except Exception as exc:
                log.debug("dial %s failed: %s", peer, exc)

    async def _dial_bootstrap(self) -> None:
        """The operator's address, its name resolved again (net/resolve.py), within the budget."""
        assert self.bootstrap is not None
        if not self.budget.allow(self.bootstrap.peer_id.to_base58(), time.monotonic()):
            return
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            try:
                await connect_operator_peer(self.state.host, self.bootstrap)
            except Exception as exc:
                log.debug("dial of the bootstrap failed: %s", exc)

    async def _put_record_in_dht(self) -> None:
        """Our signed record under /p2ptrain/peer/<id>; the bootstrap also puts /p2ptrain/run."""
        state = self.state
        puts = [(peer_key(state.peer_id), record_message(state))]
        if state.role == "bootstrap" and state.view.run is not None:
            puts.append((RUN_KEY, run_message(state)))
        for key, value in puts:
            with trio.move_on_after(DHT_TIMEOUT_S):
                try:
                    with own_operation():
                        await self.dht.put_value(key, value)
                except Exception as exc:
                    log.info("DHT put of %s failed: %s", key, exc)
