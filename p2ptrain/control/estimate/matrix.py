"""The planner's link matrix for a swarm it cannot measure in full: every pair estimated from
the coordinates (round trip) and access capacities (rate), every pair some end measured taken
as measured, and masks that say which is which (status and the dashboard show them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from p2ptrain.control.estimate.book import is_full_mesh
from p2ptrain.control.estimate.capacity import directed_rate
from p2ptrain.control.estimate.consistency import doubted_links, doubted_reporters
from p2ptrain.control.estimate.fit import fitted_rtts
from p2ptrain.control.links import Link
from p2ptrain.control.planning.planner import (
    DEFAULT_BANDWIDTH_GBPS,
    DEFAULT_DELAY_MS,
    MAX_MEASURED_BANDWIDTH_GBPS,
    MAX_MEASURED_DELAY_MS,
    MIN_MEASURED_BANDWIDTH_GBPS,
    RELAYED_RATE_SHARE,
    UNREACHABLE_BANDWIDTH_GBPS,
    UNREACHABLE_DELAY_MS,
    Matrices,
    build_matrices,
    worst_measured,
)
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate

# A rate measured well below what both ends were seen to reach was held back by the path (a long
# or congested route), not an access link: such samples, binned by round trip, cap the estimates
# of unmeasured pairs as far apart (TCP over a long path reaches less of its ends' capacity).
PATH_LIMITED_SHARE = 0.7
PATH_BIN_EDGES_MS = np.geomspace(1.0, 2000.0, 16)
MIN_PATH_SAMPLES = 3
# a direction of a peer's access link never seen: priced as this quantile of those seen, but
# not below the median's UNSEEN_RATE_FLOOR share: 5 of 41 members reporting 0.01 Mbit/s of
# themselves priced every joiner at 0.01 Mbit/s on its unmeasured pairs
UNSEEN_RATE_QUANTILE = 0.1
UNSEEN_RATE_FLOOR = 0.1

BoolMatrix = npt.NDArray[np.bool_]
FloatMatrix = npt.NDArray[np.float64]


@dataclass(frozen=True)
class EstimatedMatrices:
    """The matrices the scheduler plans on, and which entries were measured (not estimated)."""

    matrices: Matrices
    rtt_measured: BoolMatrix
    rate_measured: BoolMatrix

    @property
    def measured_fraction(self) -> float:
        n = len(self.matrices.peers)
        pairs = n * (n - 1)
        return float(np.count_nonzero(self.rtt_measured)) / pairs if pairs else 1.0


def estimated_rtts(peers: Sequence[str], coords: Mapping[str, NetCoordinate]) -> FloatMatrix:
    """Predicted round trips (ms) among peers; NaN where an end has no coordinate."""
    n = len(peers)
    dims = len(next(iter(coords.values())).vector) if coords else 1
    vectors = np.full((n, dims), np.nan)
    heights = np.full(n, np.nan)
    for i, peer in enumerate(peers):
        coord = coords.get(peer)
        if coord is not None:
            vectors[i], heights[i] = coord.vector, coord.height_ms
    distance = np.linalg.norm(vectors[:, None, :] - vectors[None, :, :], axis=2)
    return distance + heights[:, None] + heights[None, :]


def estimated_rates(peers: Sequence[str], capacities: Mapping[str, AccessCapacity]) -> FloatMatrix:
    """The bottleneck of the two ends (Mbit/s), slower direction; NaN where nothing is known.
    A direction never seen is priced low, not as its other one: an upload as a slow one of the
    swarm's (UNSEEN_RATE_QUANTILE) at most its download (a home link sends at a tenth of its
    download), a download as its upload, a peer never seen at all as slow ones both ways (it was
    priced as the other end of each of its pairs: `bench control` priced a peer that joined just
    before the plan 3-12x too fast, and the plan put it where it held a ring back)."""
    n = len(peers)
    up = np.array([_or_nan(capacities.get(p), "up") for p in peers])
    down = np.array([_or_nan(capacities.get(p), "down") for p in peers])
    if n == 0 or (np.isnan(up).all() and np.isnan(down).all()):
        return np.full((n, n), np.nan)
    seen = up[~np.isnan(up)] if not np.isnan(up).all() else down[~np.isnan(down)]
    typical_up = _typical(seen)
    seen = down[~np.isnan(down)] if not np.isnan(down).all() else seen
    typical_down = _typical(seen)
    seen_up = ~np.isnan(up)
    up = np.where(seen_up, up, np.fmin(down, typical_up))
    down = np.where(np.isnan(down), np.where(seen_up, up, typical_down), down)
    forward = np.minimum(up[:, None], down[None, :])
    return np.minimum(forward, forward.T)


def _typical(seen: FloatMatrix) -> float:
    """What an unseen direction is priced at: a slow one of those seen, robust to a few liars."""
    low = float(np.quantile(seen, UNSEEN_RATE_QUANTILE))
    return max(low, UNSEEN_RATE_FLOOR * float(np.median(seen)))


def observed_rates(peers: Sequence[str], capacities: Mapping[str, AccessCapacity]) -> FloatMatrix:
    """The bottleneck of the two ends' access links in both directions, from what each end was
    seen to reach in that very direction (no direction filled from the other); NaN where any of
    the four is unknown."""
    up = np.array([_or_nan(capacities.get(p), "up") for p in peers])
    down = np.array([_or_nan(capacities.get(p), "down") for p in peers])
    forward = np.minimum(up[:, None], down[None, :])  # NaN stays NaN
    return np.minimum(forward, forward.T)


def _or_nan(capacity: AccessCapacity | None, which: str) -> float:
    if capacity is None:
        return float("nan")
    value = capacity.up_mbps if which == "up" else capacity.down_mbps
    return float("nan") if value is None else value


def path_caps(
    rtts: FloatMatrix,
    rates: FloatMatrix,
    measured_rates: FloatMatrix,
    measured: BoolMatrix,
    reporters: npt.NDArray[np.int_] | None = None,
) -> FloatMatrix:
    """Per pair, the median rate of path-limited samples at a like round trip (inf: no cap),
    each reporter one voice (`reporters`: whose word each sample is; its samples' median) and
    MIN_PATH_SAMPLES voices needed: one member claiming a vast capacity and 0.001 Mbit/s on its
    own links at round trips in every bin capped every unmeasured pair of the swarm at 0.001.
    `rates`: what the ends' access links allow (observed_rates); a sample whose ends' are not
    all known cannot be told path-limited (an upload never seen is no evidence of a fast one)."""
    if reporters is None:
        reporters = np.arange(rtts.size).reshape(rtts.shape)  # every sample its own voice
    limited = measured & (measured_rates < PATH_LIMITED_SHARE * np.nan_to_num(rates, nan=0.0))
    bins = np.digitize(rtts, PATH_BIN_EDGES_MS)
    # the limited samples grouped by bin and reporter: two N x N masks per bin and reporter
    # took 3.6 s at 1,000 honest peers; grouping the few samples, linear in them
    first, second = np.nonzero(limited)
    grouped: dict[int, dict[int, list[float]]] = {}
    for b, who, value in zip(
        bins[first, second].tolist(),
        reporters[first, second].tolist(),
        measured_rates[first, second].tolist(),
        strict=True,
    ):
        grouped.setdefault(b, {}).setdefault(who, []).append(value)
    per_bin = np.full(len(PATH_BIN_EDGES_MS) + 1, np.inf)  # digitize's bins: 0..len(edges)
    for b, by in grouped.items():
        voices = [_median(samples) for samples in by.values()]
        if len(voices) >= MIN_PATH_SAMPLES:
            per_bin[b] = _median(voices)
    caps: FloatMatrix = per_bin[bins]
    return caps


def _median(values: list[float]) -> float:
    """np.median's value of a few finite floats (the two middle ones' sum halved), without its
    ~30 us a call: a bin's voices are thousands of short lists at 1,000 peers."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def build_estimated(
    peers: Sequence[str],
    coords: Mapping[str, NetCoordinate],
    capacities: Mapping[str, AccessCapacity],
    links: Mapping[tuple[str, str], Link],
) -> EstimatedMatrices:
    """The planner's matrices: measured links where an end measured them (`links`, as
    control/links.py merges them), estimates elsewhere, medians where even those are missing."""
    n = len(peers)
    index = {p: i for i, p in enumerate(peers)}
    rtt = estimated_rtts(peers, coords)
    rate = estimated_rates(peers, capacities)
    measured_rtt = np.full((n, n), np.nan)
    measured_rate = np.full((n, n), np.nan)
    rate_reporter = np.full((n, n), -1)  # whose word each measured rate is (path_caps)
    reporters: dict[str, int] = {}
    for (a, b), link in links.items():
        i, j = index.get(a), index.get(b)
        if i is None or j is None:
            continue
        if link.rtt_ms is not None:
            measured_rtt[i, j] = measured_rtt[j, i] = link.rtt_ms
        if link.bandwidth_mbps is not None and link.bandwidth_mbps > 0:
            measured_rate[i, j] = measured_rate[j, i] = _both_ways(link, a, b, capacities)
            reporter = reporters.setdefault(link.rate_from, len(reporters))
            rate_reporter[i, j] = rate_reporter[j, i] = reporter
    rtt_known, rate_known = ~np.isnan(measured_rtt), ~np.isnan(measured_rate)
    # the planner's fit to every measured sample beats the nodes' own coordinates, where it
    # could place both ends (control/estimate/fit.py)
    fitted = fitted_rtts(peers, measured_rtt)
    rtt = np.where(np.isnan(fitted), rtt, fitted)
    best_rtt = np.where(rtt_known, measured_rtt, rtt)
    caps = path_caps(
        best_rtt, observed_rates(peers, capacities), measured_rate, rate_known, rate_reporter
    )
    rate = np.fmin(rate, caps)
    rtt = best_rtt
    rate = np.where(rate_known, measured_rate, rate)
    off = ~np.eye(n, dtype=bool)
    for matrix, fallback in ((rtt, 2 * DEFAULT_DELAY_MS), (rate, DEFAULT_BANDWIDTH_GBPS * 1e3)):
        known = matrix[off & ~np.isnan(matrix)]
        matrix[np.isnan(matrix)] = float(np.median(known)) if known.size else fallback
    delay_ms = rtt / 2
    bandwidth = np.clip(rate / 1e3, MIN_MEASURED_BANDWIDTH_GBPS, MAX_MEASURED_BANDWIDTH_GBPS)
    np.fill_diagonal(delay_ms, 0.0)
    np.fill_diagonal(bandwidth, 1e6)  # "local": effectively free, as planner.build_matrices
    num_measured = int(np.count_nonzero(rtt_known & off)) // 2
    np.fill_diagonal(rtt_known, False)
    np.fill_diagonal(rate_known, False)
    return EstimatedMatrices(
        Matrices(list(peers), delay_ms, bandwidth, num_measured), rtt_known, rate_known
    )


def _both_ways(link: Link, a: str, b: str, capacities: Mapping[str, AccessCapacity]) -> float:
    """A measured pair's rate, the slower direction: an end times only its sending direction,
    so a rate one end measured says nothing of the other way, which the capacities then bound
    (a home link's upload is a tenth of its download: one end's word alone over-priced such a
    pair up to 8x in `bench control`)."""
    assert link.bandwidth_mbps is not None
    if len(link.rate_by) != 1:
        return link.bandwidth_mbps
    sender = link.rate_by[0]
    receiver = b if sender == a else a
    ends = capacities.get(receiver), capacities.get(sender)
    back = None if None in ends else directed_rate(*ends)  # type: ignore[arg-type]
    return link.bandwidth_mbps if back is None else min(link.bandwidth_mbps, back)


def measured_masks(
    peers: Sequence[str], links: Mapping[tuple[str, str], Link]
) -> tuple[BoolMatrix, BoolMatrix]:
    """Which pairs' round trips and rates some end measured (symmetric, false on the diagonal)."""
    n = len(peers)
    index = {p: i for i, p in enumerate(peers)}
    rtt_known = np.zeros((n, n), dtype=bool)
    rate_known = np.zeros((n, n), dtype=bool)
    for (a, b), link in links.items():
        i, j = index.get(a), index.get(b)
        if i is None or j is None or i == j:
            continue
        rtt_known[i, j] = rtt_known[j, i] = link.rtt_measured
        rate_known[i, j] = rate_known[j, i] = link.rate_measured
    return rtt_known, rate_known


def live_matrices(
    peers: Sequence[str],
    links: Mapping[tuple[str, str], Link],
    coords: Mapping[str, NetCoordinate],
    capacities: Mapping[str, AccessCapacity],
    private: frozenset[str] = frozenset(),
    relayed: frozenset[tuple[str, str]] = frozenset(),
) -> EstimatedMatrices:
    """The live planner's matrices. A swarm of at most FULL_MESH_PEERS measures every link:
    planner.build_matrices as always (a gap: the median). A bigger one: measured links where an
    end measured them, coordinates and capacities elsewhere (build_estimated), with
    build_matrices' pricing of relayed links (a share of their rate), of links whose probes fail
    (the worst measured) and of two `private` peers (unreachable)."""
    if not is_full_mesh(len(peers)) and coords:  # where one end's word alone stands
        links = doubted_links(links, doubted_reporters(links, peers))
    rtt_known, rate_known = measured_masks(peers, links)
    if is_full_mesh(len(peers)) or not coords:
        matrices = build_matrices(list(peers), dict(links), private, relayed)
        return EstimatedMatrices(matrices, rtt_known, rate_known)
    estimated = build_estimated(peers, coords, capacities, links)
    m = estimated.matrices
    delay, rate = np.minimum(m.delay_ms, MAX_MEASURED_DELAY_MS), m.bandwidth_gbps.copy()
    index = {p: i for i, p in enumerate(peers)}
    worst_delay_ms, worst_gbps = worst_measured(links, peers, relayed)
    for (a, b), link in links.items():
        i, j = index.get(a), index.get(b)
        if i is None or j is None or i == j:
            continue
        if (a, b) in relayed and rate_known[i, j]:
            rate[i, j] = rate[j, i] = max(
                RELAYED_RATE_SHARE * rate[i, j], MIN_MEASURED_BANDWIDTH_GBPS
            )
        if link.rtt_failed and worst_delay_ms is not None:
            delay[i, j] = delay[j, i] = worst_delay_ms
        if link.rate_failed and worst_gbps is not None:
            rate[i, j] = rate[j, i] = worst_gbps
    apart = [index[p] for p in peers if p in private]
    for i in apart:
        for j in apart:
            if i != j:
                delay[i, j], rate[i, j] = UNREACHABLE_DELAY_MS, UNREACHABLE_BANDWIDTH_GBPS
    matrices = Matrices(list(peers), delay, rate, m.num_measured_delays)
    return EstimatedMatrices(matrices, rtt_known, rate_known)
