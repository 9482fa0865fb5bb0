"""The links a plan of bench control's planner rests on, and its estimate with their direct
measurements in place: what control_bench.py confirms a first plan on before committing it (as
control/planning/confirm.py does live). A plan rests on its pipeline neighbours and its
data-parallel groups (every pair of a small group, a ring of a big one); a link measured by both
ends takes the pessimistic end's word, as control/links.py merges them."""

from __future__ import annotations

import itertools

from p2ptrain.control.estimate.matrix import EstimatedMatrices
from p2ptrain.harness.control_sim_state import SimPeer

MAX_GROUP_ALL_PAIRS = 8


def plan_links(pipelines: list[list[int]]) -> set[tuple[int, int]]:
    """Pipeline neighbours and data-parallel ring neighbours (positions in `members`)."""
    pairs: set[tuple[int, int]] = set()
    for pipe in pipelines:
        pairs.update(itertools.pairwise(pipe))
    for stage in zip(*pipelines, strict=True):
        group = list(stage)  # the cost prices every pair of a small group; a big one: a ring
        if len(group) <= MAX_GROUP_ALL_PAIRS:
            pairs.update((a, b) for a in group for b in group if a < b)
        else:
            pairs.update(zip(group, group[1:] + group[:1], strict=True))
    return {(min(a, b), max(a, b)) for a, b in pairs if a != b}


def with_measured(
    peers: list[SimPeer],
    estimate: EstimatedMatrices,
    members: list[int],
    links: set[tuple[int, int]],
) -> EstimatedMatrices:
    """`estimate` with what the `links`' ends measured (positions in `members`) in place."""
    m = estimate.matrices
    delay, rate = m.delay_ms.copy(), m.bandwidth_gbps.copy()
    rtt_known, rate_known = estimate.rtt_measured.copy(), estimate.rate_measured.copy()
    for a, b in links:
        ends = [peers[members[x]].links.get(members[y]) for x, y in ((a, b), (b, a))]
        rtts = [s.rtt_ms for s in ends if s is not None and s.rtt_ms is not None]
        rates = [s.bandwidth_mbps for s in ends if s is not None and s.bandwidth_mbps is not None]
        if rtts:  # the pessimistic end, as control/links.py merges them
            delay[a, b] = delay[b, a] = max(rtts) / 2
            rtt_known[a, b] = rtt_known[b, a] = True
        if rates:
            rate[a, b] = rate[b, a] = min(rates) / 1e3
            rate_known[a, b] = rate_known[b, a] = True
    matrices = type(m)(list(m.peers), delay, rate, m.num_measured_delays)
    return EstimatedMatrices(matrices, rtt_known, rate_known)
