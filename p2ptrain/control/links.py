"""Link measurements: one peer's own samples towards others, and the knowledge of every pair
merged from everyone's gossiped rows. Pure, with monotonic time passed in.

A pair (a, b) is measured by its two ends, each in its own row. Where both have a recent
measurement, the pessimistic one counts (the larger round trip, the smaller rate): a peer can
make its own links look worse than its counterpart measured them, which only keeps work away
from itself, but never better, which would steer the planner's demanding links onto it. Nor
can it keep its counterpart from measuring: where one end's latest probes of a link failed
(DISTRUST_AFTER_FAILURES in a row: the far end refused them, or did not prove the bytes
arrived), that kind of measurement of the link is `failed`, whatever the other end says, and
the planner prices it at the swarm's worst (control/planning/planner.py)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from p2ptrain.control.estimate.book import FULL_MESH_PEERS, EstimateBook, is_full_mesh
from p2ptrain.control.round_watch import RoundWatch
from p2ptrain.records import LinkReport, Telemetry

MAX_LINK_AGE_S = 60.0  # round trips older than this are forgotten (rates: MAX_RATE_AGE_S)
# A link that carries training traffic queues our probes: its round trip grows and a bandwidth
# probe gets only a share of the rate. The planner needs the link's own delay and capacity, so a
# sample reports the least round trip and the highest rate of its probes within a window: busy
# moments do not look like drift, and a link that really got worse shows it once its better
# probes have rolled out. The counts cover the window at the probing pace (control/measuring.py:
# with 8 members, a peer's RTT is probed every ~7 s, its rate every ~140 s): with 5 RTTs, a
# training swarm's queued probes were all that was left after 35 s and re-planned it.
RECENT_RTTS = 48
RECENT_RATES = 12
RECENT_WINDOW_S = 300.0
# A rate is the best of its window, so it lives as long: each end re-probes a link only every
# (members x BANDWIDTH_PROBE_INTERVAL_S), and a rate forgotten after 60 s left gaps in the
# planner's matrix, filled with the median, which read as drift
MAX_RATE_AGE_S = RECENT_WINDOW_S
# consecutive failed probes of one kind after which a link's measurements of that kind count
# for nothing (one failure may be a busy moment; the next success clears it)
DISTRUST_AFTER_FAILURES = 2
# a probe that overlapped our worker's outer round is set aside while the link's last counted
# value of its kind is younger than this (control/round_watch.py); past it, it counts
ROUND_HOLD_S = {"rtt": MAX_LINK_AGE_S / 2, "bandwidth": MAX_RATE_AGE_S / 2}
# Past the full mesh an honest row names its neighbour set (at most 12): a member's row is kept
# to this many entries, members first, then measured ones, freshest first. Kept whole, a row of
# up to 1,024 ids (made-up or real) cost the planner's every tick: 100 members naming 590 made
# up ids each, freshest() 0.6 s a tick (0.1 s for 1,000 honest members)
MAX_ROW_ENTRIES = FULL_MESH_PEERS
FRESHEST_KEPT_S = 1.0  # freshest() is remembered this long while nothing changed


@dataclass
class LinkSample:
    """This peer's own measurements towards one other peer (monotonic timestamps): the estimates
    from the recent probes, and when the latest probe was made."""

    rtt_ms: float | None = None
    rtt_at: float | None = None
    bandwidth_mbps: float | None = None
    bandwidth_at: float | None = None
    num_failures: int = 0  # RTT probes failed in a row (LinkTable.record_rtt clears it)
    rate_failures: int = 0  # bandwidth probes failed in a row
    failed_at: float | None = None  # the latest failed probe of either kind
    # a window-bound probe's rate (control/measuring.py): only a floor, for sizing the next
    # probe; the link counts as measured once a probe is not window-bound
    rate_floor_mbps: float | None = None
    recent_rtts: list[tuple[float, float]] = field(default_factory=list)  # (at, ms)
    recent_rates: list[tuple[float, float]] = field(default_factory=list)  # (at, Mbit/s)

    def add_rtt(self, rtt_ms: float, now: float) -> None:
        self.recent_rtts = _recent(self.recent_rtts, (now, rtt_ms), RECENT_RTTS)
        self.rtt_ms, self.rtt_at = min(v for _, v in self.recent_rtts), now

    def add_bandwidth(self, mbps: float, now: float, window_bound: bool = False) -> None:
        self.rate_failures = 0
        if window_bound and self.bandwidth_mbps is None:
            self.rate_floor_mbps = max(mbps, self.rate_floor_mbps or 0.0)
            return
        self.recent_rates = _recent(self.recent_rates, (now, mbps), RECENT_RATES)
        self.bandwidth_mbps, self.bandwidth_at = max(v for _, v in self.recent_rates), now


def _recent(
    samples: list[tuple[float, float]], new: tuple[float, float], keep: int
) -> list[tuple[float, float]]:
    """The last `keep` samples, `new` included, none older than RECENT_WINDOW_S."""
    kept = [*(s for s in samples if new[0] - s[0] <= RECENT_WINDOW_S), new]
    return kept[-keep:]


@dataclass
class Link:
    """What the swarm knows about one unordered pair, from either side."""

    rtt_ms: float | None
    bandwidth_mbps: float | None
    age_s: float
    # an end's latest probes of this kind failed: the values above are None, and the link is
    # priced as the worst measured one
    rtt_failed: bool = False
    rate_failed: bool = False
    # the ends whose word the rate is (each times its own sending direction): with one, the
    # other direction is unmeasured (control/estimate/matrix.py bounds it by the capacities)
    rate_by: tuple[str, ...] = ()
    rtt_by: tuple[str, ...] = ()  # the ends whose word the round trip is (one: that end's alone)
    rate_from: str = ""  # the end whose word the rate is (the lower of two)
    # the other end's word where both spoke (the optimistic of two): what the worst measured
    # link is judged on, so that one end's pessimism about its own links prices no other pair
    rtt_low_ms: float | None = None
    rate_high_mbps: float | None = None

    @property
    def rtt_measured(self) -> bool:
        return self.rtt_ms is not None

    @property
    def rate_measured(self) -> bool:
        return bool(self.bandwidth_mbps)


def link_between(links: Mapping[tuple[str, str], Link], a: str, b: str) -> Link | None:
    """The unordered pair's link, whichever way round it is keyed."""
    return links.get((a, b)) or links.get((b, a))


def freshest_links(
    rows: dict[str, tuple[dict[str, LinkReport], float]],
    now: float,
    among: Collection[str] | None = None,
) -> dict[tuple[str, str], Link]:
    """Every unordered pair measured recently (round trips in the last MAX_LINK_AGE_S, rates
    in the last MAX_RATE_AGE_S), from every author's row (as
    received at a monotonic time: a row's ages count from when it arrived); each end's freshest
    value, the pessimistic of the two ends'; none where an end's probes of that kind fail
    (the link is then `failed` for that kind: never measured at one end's word). With `among`,
    only entries naming one of those peers count (the others are no members of ours)."""
    # pair -> end -> (age, value); an author's row only speaks for pairs it is an end of
    rtts: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    bws: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    rtt_failed: set[tuple[str, str]] = set()
    rate_failed: set[tuple[str, str]] = set()
    for author, (row, received_at) in rows.items():
        delay = now - received_at
        for peer, link in row.items():
            if among is not None and peer not in among:
                continue
            pair = (min(author, peer), max(author, peer))
            if delay <= MAX_LINK_AGE_S and link.rtt_failures >= DISTRUST_AFTER_FAILURES:
                rtt_failed.add(pair)
            if delay <= MAX_RATE_AGE_S and link.bandwidth_failures >= DISTRUST_AFTER_FAILURES:
                rate_failed.add(pair)
            for value, age, table, max_age in (
                (link.rtt_ms, link.rtt_age_s, rtts, MAX_LINK_AGE_S),
                (link.bandwidth_mbps, link.bandwidth_age_s, bws, MAX_RATE_AGE_S),
            ):
                if value is None or age is None or age + delay > max_age:
                    continue
                ends = table.setdefault(pair, {})
                if author not in ends or age + delay < ends[author][0]:
                    ends[author] = (age + delay, float(value))
    result = {}
    for pair in set(rtts) | set(bws) | rtt_failed | rate_failed:
        rtt, bw = rtts.get(pair, {}).values(), bws.get(pair, {}).values()
        rate_ends = bws.get(pair, {})
        rate_from = min(rate_ends, key=lambda end: (rate_ends[end][1], end), default="")
        result[pair] = Link(
            rtt_ms=None if pair in rtt_failed else max((v for _, v in rtt), default=None),
            bandwidth_mbps=None if pair in rate_failed else min((v for _, v in bw), default=None),
            age_s=min((age for age, _ in [*rtt, *bw]), default=0.0),
            rtt_failed=pair in rtt_failed,
            rate_failed=pair in rate_failed,
            rate_by=tuple(sorted(bws.get(pair, {}))),
            rtt_by=tuple(sorted(rtts.get(pair, {}))),
            rate_from="" if pair in rate_failed else rate_from,
            rtt_low_ms=None if pair in rtt_failed else min((v for _, v in rtt), default=None),
            rate_high_mbps=None if pair in rate_failed else max((v for _, v in bw), default=None),
        )
    return result


@dataclass
class LinkTable:
    """The view's `links` part: our own samples towards others, the rows others gossiped, and
    what both feed (coordinates, capacities, the neighbour set; our worker's outer rounds)."""

    self_id: str
    samples: dict[str, LinkSample] = field(default_factory=dict)  # ours, per far end
    # author -> (its gossiped row, when it arrived, monotonic)
    rows: dict[str, tuple[dict[str, LinkReport], float]] = field(default_factory=dict)
    # peer -> how we reach it, when not direct (control/traversal.py)
    connections: dict[str, str] = field(default_factory=dict)
    # coordinates, capacities, the neighbour set (control/estimate/book.py)
    estimate: EstimateBook = field(default_factory=EstimateBook)
    rounds: RoundWatch = field(default_factory=RoundWatch)  # our worker's outer rounds
    # bumped by every change freshest() reads (rows: note_telemetry and forget only)
    _version: int = field(default=0, init=False, repr=False, compare=False)
    _freshest: tuple[tuple[object, ...], float, dict[tuple[str, str], Link]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def note_telemetry(self, author: str, body: Telemetry, now: float) -> None:
        """An author's gossiped row and its word about its own place in the network; past the
        full mesh, at most MAX_ROW_ENTRIES of the row (`_kept_row`)."""
        row = body.links
        if self._past_full_mesh(len(self.rows) + (author not in self.rows)):
            row = self._kept_row(author, row)
        self.rows[author] = (row, now)
        self._version += 1
        self.estimate.note(author, body.coordinate, body.capacity, now)

    def _past_full_mesh(self, num_rows: int) -> bool:
        """Is the swarm past the full mesh, by our neighbour set or by the rows we hold?"""
        return self.estimate.sampled or not is_full_mesh(num_rows + 1)

    def _kept_row(self, author: str, row: dict[str, LinkReport]) -> dict[str, LinkReport]:
        """The row's first MAX_ROW_ENTRIES entries by: naming a member (a peer whose row we
        hold, or us), then saying something (a value or failures), then the freshest; never
        the author itself. An honest row (12 neighbours at most) is kept whole."""
        if len(row) <= MAX_ROW_ENTRIES and author not in row:
            return row

        def rank(entry: tuple[str, LinkReport]) -> tuple[bool, bool, float, str]:
            peer, link = entry
            ages = [a for a in (link.rtt_age_s, link.bandwidth_age_s) if a is not None]
            says = bool(ages) or bool(link.rtt_failures or link.bandwidth_failures)
            member = peer == self.self_id or peer in self.rows
            return (not member, not says, min(ages, default=math.inf), peer)

        entries = ((p, link) for p, link in row.items() if p != author)
        return dict(heapq.nsmallest(MAX_ROW_ENTRIES, entries, key=rank))

    def forget(self, peer: str) -> None:
        self.rows.pop(peer, None)
        self.samples.pop(peer, None)
        self.estimate.forget(peer)
        self._version += 1

    def record_rtt(self, peer: str, rtt_ms: float, now: float) -> None:
        """One round trip we measured: the link's sample, and our coordinate moved by the
        sample's filtered round trip (the least recent one: queueing is not distance)."""
        sample = self.samples.setdefault(peer, LinkSample())
        sample.add_rtt(rtt_ms, now)
        sample.num_failures = 0
        self._version += 1
        if sample.rtt_ms is not None:
            self.estimate.observe_rtt(peer, sample.rtt_ms)

    def record_bandwidth(
        self, peer: str, mbps: float, now: float, window_bound: bool = False
    ) -> None:
        self.samples.setdefault(peer, LinkSample()).add_bandwidth(mbps, now, window_bound)
        self._version += 1
        if not window_bound:  # a floor says nothing of our uplink
            self.estimate.observe_rate(mbps, now, sending=True)

    def counts_probe(self, peer: str, kind: str, started_at: float, now: float) -> bool:
        """Does a probe of `kind` ("rtt" or "bandwidth") to `peer` made over [started_at, now]
        count? Not if it overlapped our worker's outer round (its traffic, not the link) while
        the link has a counted value of that kind younger than ROUND_HOLD_S."""
        if not self.rounds.disturbed(started_at, now):
            return True
        sample = self.samples.get(peer)
        at = None if sample is None else sample.rtt_at if kind == "rtt" else sample.bandwidth_at
        return at is None or now - at > ROUND_HOLD_S[kind]

    def record_probe_failure(self, peer: str, now: float, kind: str = "rtt") -> None:
        """One more failed probe of `kind` ("rtt" or "bandwidth") to `peer`."""
        sample = self.samples.setdefault(peer, LinkSample())
        if kind == "bandwidth":
            sample.rate_failures += 1
        else:
            sample.num_failures += 1
        sample.failed_at = now
        self._version += 1

    def own_row(self, now: float) -> dict[str, LinkReport]:
        """Our measurements as gossiped in telemetry: values with their ages in seconds; in a
        swarm too big to measure in full, of our neighbour set only (O(neighbours), not O(N))."""
        row: dict[str, LinkReport] = {}
        told = set(self.estimate.neighbours) if self.estimate.sampled else None
        for peer, s in self.samples.items():
            if told is not None and peer not in told:
                continue
            rtt_age = None if s.rtt_at is None else round(now - s.rtt_at, 3)
            bw_age = None if s.bandwidth_at is None else round(now - s.bandwidth_at, 3)
            # failures are told while recent: the link's last word until a probe succeeds
            failing = s.failed_at is not None and now - s.failed_at <= MAX_RATE_AGE_S
            if (
                (rtt_age is None or rtt_age > MAX_LINK_AGE_S)
                and (bw_age is None or bw_age > MAX_RATE_AGE_S)
                and not failing
            ):
                continue
            connection = self.connections.get(peer, "direct")
            row[peer] = LinkReport(
                s.rtt_ms,
                rtt_age,
                s.bandwidth_mbps,
                bw_age,
                connection,
                rtt_failures=s.num_failures if failing else 0,
                bandwidth_failures=s.rate_failures if failing else 0,
            )
        return row

    def connection(self, a: str, b: str) -> str:
        """How the a-b link's bytes travel, as its ends report it: relayed or holepunched if
        either end says so (a relay sits in the path either way), else direct."""
        said = []
        for near, far in ((a, b), (b, a)):
            if near == self.self_id:
                said.append(self.connections.get(far, "direct"))
            elif near in self.rows and far in self.rows[near][0]:
                said.append(self.rows[near][0][far].connection)
        for kind in ("relayed", "holepunched"):
            if kind in said:
                return kind
        return "direct"

    def freshest(self, now: float) -> dict[tuple[str, str], Link]:
        """The freshest measurement of every unordered pair, from our own and gossiped rows;
        past the full mesh, of members' pairs only (a gossiped entry naming a peer whose row we
        do not hold counts for nothing: made-up ids never reach the planner). Remembered for
        FRESHEST_KEPT_S while nothing it reads changed (the planner asks every tick)."""
        sampled = self._past_full_mesh(len(self.rows))
        key = (self._version, len(self.rows), sampled, self.estimate.neighbours)
        if self._freshest is not None:
            kept_key, at, kept = self._freshest
            if kept_key == key and 0.0 <= now - at < FRESHEST_KEPT_S:
                return dict(kept)
        own = self.own_row(now)
        among = {*self.rows, self.self_id, *own} if sampled else None
        links = freshest_links({**self.rows, self.self_id: (own, now)}, now, among)
        self._freshest = (key, now, links)
        return dict(links)
