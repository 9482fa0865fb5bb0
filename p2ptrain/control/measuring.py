"""This peer's measurements of its links: one RTT probe per second and one bandwidth probe every
~20 s (60 s in a sampled set once measured), each to the peer of its neighbour set measured
longest ago, recorded into the SwarmView (which gossips them as telemetry); an RTT probe's
answer also carries the far end's coordinate (its Vivaldi update needs it, and outside
telemetry's audience nothing else brings it). The neighbour set (control/estimate/book.py) is
every member in a swarm of at most FULL_MESH_PEERS; in a bigger one, a bounded set: the nearest
by coordinate, a few at random, and the peers the plan makes this one exchange with (measured
first). A failure or rate measured during our worker's outer round is set aside while the link
has a recent value (control/round_watch.py): the round's traffic is not the link."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError

from p2ptrain.control.estimate.book import plan_partners
from p2ptrain.control.links import LinkSample
from p2ptrain.control.view import SwarmView
from p2ptrain.net import probe
from p2ptrain.records.estimate import NetCoordinate

log = logging.getLogger(__name__)

RTT_PROBE_INTERVAL_S = 1.0  # one probe, to the stalest link
# Once the plan has stood PLAN_STOOD_S, a probe goes out only to a neighbour whose round trip is
# older than RTT_REFRESH_S (half of MAX_LINK_AGE_S, when links are forgotten): with 12
# neighbours, 0.4 probes a second instead of 1. A probe is a fresh stream, 5 echoes and a
# trailer, ~20 frames each way counting the server's side: at 32 live peers on one machine,
# probes were over half of a member's frames in steady state. Before that, and for a new
# neighbour or plan partner (never measured: always the stalest), one a second.
RTT_REFRESH_S = 30.0
# ... in a sampled neighbour set (past FULL_MESH_PEERS), whose coordinates settled before the
# first plan: still inside MAX_LINK_AGE_S (control/links.py), so no measured link goes missing
# from the planner's matrix between two probes (at 32 live peers a member still sent 0.65
# probes a second at 30 s, its largest source of frames in steady state)
SAMPLED_RTT_REFRESH_S = 45.0
PLAN_STOOD_S = 30.0
MAX_RTT_PROBES_AT_ONCE = 3
BANDWIDTH_PROBE_INTERVAL_S = 20.0
# a sampled neighbour set (past FULL_MESH_PEERS) in steady state, as bench control simulates: a
# probe moves up to 2 MiB through the node's Python stack, and 32 members probing every 20 s
# were a good share of their CPU on one machine
SAMPLED_BANDWIDTH_PROBE_INTERVAL_S = 60.0
# while some live member's link has no rate yet (a new node, a newcomer), probe this often: the
# first plan waits for every link (control/planning/readiness.py)
FIRST_BANDWIDTH_PROBE_INTERVAL_S = 2.5
# the pace is looked at this often, so that it quickens as soon as a link needs a rate: read
# once per probe, a node whose loop began before it knew any member slept the steady 20 s
# first, and its swarm's first plan waited that long for its links
BANDWIDTH_PACE_TICK_S = 0.5
# the most one probe sends: 2 MiB leaves a 7 Mbit/s, 446 ms link's window behind, and a
# probe saturates a link it shares with training for seconds (4 MiB probes doubled the steps
# of a random placement across such links)
BANDWIDTH_PROBE_BYTES = 2 * 1024 * 1024
# the rate is timed over a probe's second half (net/probe.py): big enough to leave slow start
# behind in the first half, small enough not to crowd a slow link's other traffic (a swarm of
# 8 probing 256 KiB every 2 s on 7 Mbit/s links delayed its gossip until peers looked dead)
MIN_BANDWIDTH_PROBE_BYTES = 64 * 1024
FIRST_BANDWIDTH_PROBE_BYTES = 128 * 1024
BANDWIDTH_PROBE_TARGET_S = 0.5  # size later probes to last about this long on the link
# A probe whose second half crosses in a round trip or two measures TCP's window, not the link:
# rate ~ window / RTT (128 KiB read a 7 Mbit/s, 446 ms link at 1.2 Mbit/s). Sized to this many
# round trips at the rate last seen, each probe of a long link opens the window further, until
# the link's rate, not the window, is what it measures.
BANDWIDTH_PROBE_ROUND_TRIPS = 8
# a sampled neighbour set probes rates fast only until this many neighbours have one (they place
# our capacity) and every plan partner has one: the random part rotates, and a rotation is no
# reason for a burst of transfers
MIN_RATES_MEASURED = 4


def probe_bytes(last_mbps: float | None, rtt_s: float = 0.0) -> int:
    """A probe long enough to measure the link, short enough for slow links and the timeout."""
    if last_mbps is None:
        return FIRST_BANDWIDTH_PROBE_BYTES
    seconds = max(BANDWIDTH_PROBE_TARGET_S, BANDWIDTH_PROBE_ROUND_TRIPS * rtt_s)
    sized = int(last_mbps * 1e6 / 8 * seconds)
    return max(MIN_BANDWIDTH_PROBE_BYTES, min(BANDWIDTH_PROBE_BYTES, sized))


def window_bound(mbps: float, num_bytes: int, rtt_s: float) -> bool:
    """Did the probe's second half take under two round trips? Then its rate is a floor."""
    return rtt_s > 0 and (num_bytes / 2) * 8 / (mbps * 1e6) < 2 * rtt_s


def far_coordinate(trailer: bytes) -> NetCoordinate | None:
    """The coordinate a probed peer sent after its echoes; None if it sent none or garbage (the
    round trip still counts: it is measured, the coordinate only its word)."""
    if not trailer:
        return None
    try:
        return NetCoordinate.from_dict(json.loads(trailer))
    except (ValueError, RecursionError):  # WireError is a ValueError too
        return None


class LinkProber:
    """The probing loops of one control process (they start once it has joined)."""

    def __init__(self, host: IHost, view: SwarmView, joined: trio.Event) -> None:
        self.host = host
        self.view = view
        self.joined = joined
        # when each kind of probe last tried each peer: a peer whose probes fail must not stay
        # the stalest and starve every other link of measurements
        self._tried: dict[str, dict[str, float]] = {"rtt": {}, "bandwidth": {}}
        self._plan_since: tuple[int, float] = (-1, 0.0)  # the view's plan version, since when

    def coordinate_trailer(self) -> bytes:
        """Our coordinate, as our RTT probes' server sends it after the echoes (net/probe.py);
        empty if it would not decode."""
        coordinate = self.view.links.estimate.published_coordinate()
        return b"" if coordinate is None else json.dumps(coordinate.to_dict()).encode()

    def neighbours(self, now: float) -> tuple[str, ...]:
        """The live members to measure now (every one in a small swarm)."""
        view = self.view
        partners = plan_partners(view.plan, view.self_id)
        return view.links.estimate.choose(view.self_id, view.live_members(now), partners, now)

    def _stalest_peer(
        self,
        kind: str,
        measured_at: Callable[[LinkSample], float | None],
        usable: Callable[[str], bool] = lambda peer: True,
    ) -> str | None:
        """The neighbour probed longest ago (never probed first: a new plan partner is measured
        within a probe or two), ties at random; the one returned counts as tried now. Of the
        links we never tried, a rate goes first to one neither end has rated: the first plan
        waits for one rate of every link, either end's, so a link the far end rated can wait
        its turn (only that one: a link that fails keeps no other from ours). Only `usable`
        peers are chosen."""
        now = time.monotonic()
        peers = [peer for peer in self.neighbours(now) if usable(peer)]
        if not peers:
            return None
        rated = self._rated_by_either_end(now) if kind == "bandwidth" else frozenset()

        def order(peer: str) -> tuple[bool, float, float]:
            last = self._last_probed(kind, peer, measured_at)
            return (last >= 0 or peer in rated, last, random.random())

        peer = min(peers, key=order)
        self._tried[kind][peer] = now
        return peer

    def _dialable(self, peer: str) -> bool:
        """Can a probe reach `peer`: a connection to it, or an address to dial? A member is known
        from gossip before discovery gives its addresses (control/discovery.py): a probe then
        fails at once, counts as the link's failure and takes the turn of one that could run."""
        try:
            peer_id = ID.from_base58(peer)
            if self.host.get_network().get_connections(peer_id):
                return True
            return bool(self.host.get_peerstore().addrs(peer_id))
        except (ValueError, PeerStoreError):  # not a peer id; unknown, or its addresses expired
            return False

    def _rated_by_either_end(self, now: float) -> frozenset[str]:
        """The peers whose link with us has a rate, ours or the far end's (gossiped)."""
        me = self.view.self_id
        return frozenset(
            b if a == me else a
            for (a, b), link in self.view.links.freshest(now).items()
            if me in (a, b) and link.rate_measured
        )

    def _last_probed(
        self, kind: str, peer: str, measured_at: Callable[[LinkSample], float | None]
    ) -> float:
        """When we last measured `peer` this way, or tried to (-1: never)."""
        sample = self.view.links.samples.get(peer)
        at = None if sample is None else measured_at(sample)
        return max(at if at is not None else -1.0, self._tried[kind].get(peer, -1.0))

    async def serve_rtt_probes(self) -> None:
        """One RTT probe per interval, to the stalest link: the cost stays flat as N grows, and
        each pair is refreshed every ~N/2 intervals since both ends probe."""
        await self.joined.wait()
        # a probe to a far peer can take seconds (a dial, 5 round trips of 446 ms): the next
        # ones start on time beside it, a few at once at most
        running = trio.CapacityLimiter(MAX_RTT_PROBES_AT_ONCE)
        async with trio.open_nursery() as nursery:
            while True:
                await trio.sleep(RTT_PROBE_INTERVAL_S * random.uniform(0.8, 1.2))
                if running.borrowed_tokens >= running.total_tokens:
                    continue
                if not self._rtt_probe_due(time.monotonic()):
                    continue
                peer = self._stalest_peer("rtt", lambda s: s.rtt_at, self._dialable)
                if peer is not None:
                    token = object()  # the same peer may be probed again while a probe runs
                    await running.acquire_on_behalf_of(token)
                    nursery.start_soon(self._probe_rtt, peer, running, token)

    def _rtt_probe_due(self, now: float) -> bool:
        """Is a round-trip probe due now: before the plan stood PLAN_STOOD_S always, then only
        while some neighbour's round trip is older than RTT_REFRESH_S (SAMPLED_RTT_REFRESH_S in
        a sampled set), or was never taken?"""
        version = self.view.plan_version
        if version != self._plan_since[0]:
            self._plan_since = (version, now)
        if self.view.plan is None or now - self._plan_since[1] < PLAN_STOOD_S:
            return True
        refresh_s = SAMPLED_RTT_REFRESH_S if self.view.links.estimate.sampled else RTT_REFRESH_S
        return any(
            now - self._last_probed("rtt", peer, lambda s: s.rtt_at) >= refresh_s
            for peer in self.neighbours(now)
        )

    async def _probe_rtt(self, peer: str, running: trio.CapacityLimiter, token: object) -> None:
        started_at = time.monotonic()
        try:
            rtt_ms, trailer = await probe.measure_rtt(self.host, ID.from_base58(peer))
            now = time.monotonic()
            coordinate = far_coordinate(trailer)
            if coordinate is not None:  # before the round trip: it moves ours against it
                self.view.links.estimate.note(peer, coordinate, None, now)
            # a round trip queued behind our outer round is left to the window's least one
            self.view.record_rtt(peer, rtt_ms, now)
        except Exception as exc:
            now = time.monotonic()
            if self.view.links.counts_probe(peer, "rtt", started_at, now):
                self.view.links.record_probe_failure(peer, now, "rtt")
            log.debug("RTT probe to %s failed: %s", peer, exc)
        finally:
            running.release_on_behalf_of(token)

    def _bandwidth_interval_s(self) -> float:
        """Fast while some neighbour's link has no rate yet (a window-bound probe gives only a
        floor; in a sampled set: a plan partner's, or too few to place our capacity), then the
        steady pace."""
        view = self.view
        neighbours = self.neighbours(time.monotonic())

        def rated(peer: str) -> bool:
            sample = view.links.samples.get(peer)
            return sample is not None and sample.bandwidth_mbps is not None

        if view.links.estimate.sampled:
            partners = plan_partners(view.plan, view.self_id)
            few = sum(map(rated, neighbours)) < min(MIN_RATES_MEASURED, len(neighbours))
            unmeasured = few or not all(map(rated, partners))
        else:  # knowing no member yet, we soon will: none of its links has a rate
            unmeasured = not neighbours or not all(map(rated, neighbours))
        if unmeasured:
            return FIRST_BANDWIDTH_PROBE_INTERVAL_S
        sampled = view.links.estimate.sampled
        return SAMPLED_BANDWIDTH_PROBE_INTERVAL_S if sampled else BANDWIDTH_PROBE_INTERVAL_S

    async def serve_bandwidth_probes(self) -> None:
        """One bounded transfer every few seconds, to the member measured longest ago."""
        await self.joined.wait()
        last_at, jitter = time.monotonic(), random.uniform(0.8, 1.2)
        while True:
            await trio.sleep(BANDWIDTH_PACE_TICK_S)
            waited_s = time.monotonic() - last_at
            # the fast pace is the shortest: before it, no need to ask which pace holds (the
            # neighbours of 1,000 members, every tick)
            if waited_s < FIRST_BANDWIDTH_PROBE_INTERVAL_S * jitter:
                continue
            if waited_s < self._bandwidth_interval_s() * jitter:
                continue
            last_at, jitter = time.monotonic(), random.uniform(0.8, 1.2)
            peer = self._stalest_peer("bandwidth", lambda s: s.bandwidth_at, self._dialable)
            if peer is None:
                continue
            sample = self.view.links.samples.get(peer)
            rtt_s = (sample.rtt_ms or 0.0) / 1e3 if sample else 0.0
            seen = None if sample is None else sample.bandwidth_mbps or sample.rate_floor_mbps
            num_bytes = probe_bytes(seen, rtt_s)
            started_at = time.monotonic()
            try:
                mbps = await probe.measure_bandwidth_mbps(
                    self.host, ID.from_base58(peer), num_bytes, rtt_s=rtt_s
                )
                bound = num_bytes < BANDWIDTH_PROBE_BYTES and window_bound(mbps, num_bytes, rtt_s)
                now = time.monotonic()
                if self.view.links.counts_probe(peer, "bandwidth", started_at, now):
                    self.view.links.record_bandwidth(peer, mbps, now, window_bound=bound)
            except Exception as exc:
                # refused, timed out or unproven (net/probe.py: ForgedAck): the link is not
                # measured at the other end's word (control/links.py)
                now = time.monotonic()
                if self.view.links.counts_probe(peer, "bandwidth", started_at, now):
                    self.view.links.record_probe_failure(peer, now, "bandwidth")
                log.debug("bandwidth probe to %s failed: %s", peer, exc)
