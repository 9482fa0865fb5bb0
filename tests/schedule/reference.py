"""A deliberately naive transcription of the paper's cost model, to check the fast one against.

Loops, permutations and exhaustive search only: slow, obviously right, for small inputs.
"""

from __future__ import annotations

import itertools

import numpy as np


def naive_partition_cost(
    delay_ms: np.ndarray,
    bandwidth_gbps: np.ndarray,
    groups: list[list[int]],
    c_dp_gb: float,
    c_pp_gb: float,
) -> float:
    size = len(groups[0])
    data_parallel = 0.0
    for group in groups:
        for d in group:
            total = 0.0
            for other in group:
                if other != d:
                    total += 2 * (
                        delay_ms[d, other] / 1e3 + c_dp_gb * 8 / (bandwidth_gbps[d, other] * size)
                    )
            data_parallel = max(data_parallel, total)

    def link(a: int, b: int) -> float:
        return float(delay_ms[a, b] / 1e3 + c_pp_gb * 8 / bandwidth_gbps[a, b])

    num_groups = len(groups)
    weight = np.zeros((num_groups, num_groups))
    for a in range(num_groups):
        for b in range(num_groups):
            if a != b:
                weight[a, b] = min(
                    max(link(groups[a][i], groups[b][perm[i]]) for i in range(size))
                    for perm in itertools.permutations(range(size))
                )
    pipeline = min(
        sum(weight[order[i], order[i + 1]] for i in range(num_groups - 1))
        for order in itertools.permutations(range(num_groups))
    )
    return data_parallel + 2 * pipeline


def all_partitions(peers: list[int], size: int) -> list[list[list[int]]]:
    """Every way to split peers into groups of ``size`` (group order irrelevant)."""
    if not peers:
        return [[]]
    first, rest = peers[0], peers[1:]
    out = []
    for others in itertools.combinations(rest, size - 1):
        remaining = [p for p in rest if p not in others]
        for tail in all_partitions(remaining, size):
            out.append([[first, *others], *tail])
    return out
