"""Link measurements: one peer's own samples towards others, and the freshest knowledge of
every pair merged from everyone's gossiped rows. Pure, with monotonic time passed in."""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.records import LinkReport

MAX_LINK_AGE_S = 60.0  # measurements older than this are forgotten


@dataclass
class LinkSample:
    """This peer's own latest measurements towards one other peer (monotonic timestamps)."""

    rtt_ms: float | None = None
    rtt_at: float | None = None
    bandwidth_mbps: float | None = None
    bandwidth_at: float | None = None
    num_failures: int = 0


@dataclass
class Link:
    """The freshest knowledge about one unordered pair, from either side."""

    rtt_ms: float | None
    bandwidth_mbps: float | None
    age_s: float


def freshest_links(
    rows: dict[str, tuple[dict[str, LinkReport], float]], now: float
) -> dict[tuple[str, str], Link]:
    """The freshest measurement of every unordered pair, from every author's row (as received
    at a monotonic time): a row's ages count from when it arrived."""
    rtts: dict[tuple[str, str], tuple[float, float]] = {}  # pair -> (age, value)
    bws: dict[tuple[str, str], tuple[float, float]] = {}
    for author, (row, received_at) in rows.items():
        delay = now - received_at
        for peer, link in row.items():
            pair = (min(author, peer), max(author, peer))
            for value, age, table in (
                (link.rtt_ms, link.rtt_age_s, rtts),
                (link.bandwidth_mbps, link.bandwidth_age_s, bws),
            ):
                if value is None or age is None or age + delay > MAX_LINK_AGE_S:
                    continue
                if pair not in table or age + delay < table[pair][0]:
                    table[pair] = (age + delay, float(value))
    result = {}
    for pair in set(rtts) | set(bws):
        rtt, bw = rtts.get(pair), bws.get(pair)
        ages = [x[0] for x in (rtt, bw) if x is not None]
        result[pair] = Link(
            rtt_ms=None if rtt is None else rtt[1],
            bandwidth_mbps=None if bw is None else bw[1],
            age_s=min(ages),
        )
    return result
