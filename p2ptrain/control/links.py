"""Link measurements: one peer's own samples towards others, and the knowledge of every pair
merged from everyone's gossiped rows. Pure, with monotonic time passed in.

A pair (a, b) is measured by its two ends, each in its own row. Where both have a recent
measurement, the pessimistic one counts (the larger round trip, the smaller rate): a peer can
make its own links look worse than its counterpart measured them, which only keeps work away
from itself, but never better, which would steer the planner's demanding links onto it."""

from __future__ import annotations

from dataclasses import dataclass, field

from p2ptrain.records import LinkReport

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


@dataclass
class LinkSample:
    """This peer's own measurements towards one other peer (monotonic timestamps): the estimates
    from the recent probes, and when the latest probe was made."""

    rtt_ms: float | None = None
    rtt_at: float | None = None
    bandwidth_mbps: float | None = None
    bandwidth_at: float | None = None
    num_failures: int = 0
    # a window-bound probe's rate (control/measuring.py): only a floor, for sizing the next
    # probe; the link counts as measured once a probe is not window-bound
    rate_floor_mbps: float | None = None
    recent_rtts: list[tuple[float, float]] = field(default_factory=list)  # (at, ms)
    recent_rates: list[tuple[float, float]] = field(default_factory=list)  # (at, Mbit/s)

    def add_rtt(self, rtt_ms: float, now: float) -> None:
        self.recent_rtts = _recent(self.recent_rtts, (now, rtt_ms), RECENT_RTTS)
        self.rtt_ms, self.rtt_at = min(v for _, v in self.recent_rtts), now

    def add_bandwidth(self, mbps: float, now: float, window_bound: bool = False) -> None:
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


def freshest_links(
    rows: dict[str, tuple[dict[str, LinkReport], float]], now: float
) -> dict[tuple[str, str], Link]:
    """Every unordered pair measured recently (round trips in the last MAX_LINK_AGE_S, rates
    in the last MAX_RATE_AGE_S), from every author's row (as
    received at a monotonic time: a row's ages count from when it arrived); each end's freshest
    value, the pessimistic of the two ends'."""
    # pair -> end -> (age, value); an author's row only speaks for pairs it is an end of
    rtts: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    bws: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    for author, (row, received_at) in rows.items():
        delay = now - received_at
        for peer, link in row.items():
            pair = (min(author, peer), max(author, peer))
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
    for pair in set(rtts) | set(bws):
        rtt, bw = rtts.get(pair, {}).values(), bws.get(pair, {}).values()
        result[pair] = Link(
            rtt_ms=max((v for _, v in rtt), default=None),
            bandwidth_mbps=min((v for _, v in bw), default=None),
            age_s=min(age for age, _ in [*rtt, *bw]),
        )
    return result


class LinkMeasurements:
    """The view's own link samples and the rows others gossiped (a part of SwarmView)."""

    self_id: str
    own_links: dict[str, LinkSample]
    rows: dict[str, tuple[dict[str, LinkReport], float]]
    connections: dict[str, str]  # peer -> how we reach it, when not direct (control/traversal.py)

    def record_bandwidth(
        self, peer: str, mbps: float, now: float, window_bound: bool = False
    ) -> None:
        self.own_links.setdefault(peer, LinkSample()).add_bandwidth(mbps, now, window_bound)

    def record_probe_failure(self, peer: str) -> None:
        self.own_links.setdefault(peer, LinkSample()).num_failures += 1

    def own_row(self, now: float) -> dict[str, LinkReport]:
        """Our measurements as gossiped in telemetry: values with their ages in seconds."""
        row: dict[str, LinkReport] = {}
        for peer, s in self.own_links.items():
            rtt_age = None if s.rtt_at is None else round(now - s.rtt_at, 3)
            bw_age = None if s.bandwidth_at is None else round(now - s.bandwidth_at, 3)
            if (rtt_age is None or rtt_age > MAX_LINK_AGE_S) and (
                bw_age is None or bw_age > MAX_RATE_AGE_S
            ):
                continue
            connection = self.connections.get(peer, "direct")
            row[peer] = LinkReport(s.rtt_ms, rtt_age, s.bandwidth_mbps, bw_age, connection)
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

    def links(self, now: float) -> dict[tuple[str, str], Link]:
        """The freshest measurement of every unordered pair, from our own and gossiped rows."""
        return freshest_links({**self.rows, self.self_id: (self.own_row(now), now)}, now)
