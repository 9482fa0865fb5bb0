"""The bounded set of peers one node measures directly.

A node measures a few peers, not the swarm: the nearest by estimated round trip (their links
are the ones a planner likes, and near samples pin the coordinate locally), a few at random
(far samples keep the coordinates globally right, and random choices make the measured graph
connected), and the peers its plan makes it exchange with (their links carry the training
traffic: they are measured, never estimated). The random part rotates, so over time a node
samples much of the swarm while measuring only a handful at once. Deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NUM_NEAREST = 4
NUM_RANDOM = 4
MAX_PARTNERS = 4  # pipeline neighbours (2) and the data-parallel ring's (2)
ROTATE_RANDOM_S = 30.0  # a new random part this often


@dataclass(frozen=True)
class NeighbourPolicy:
    num_nearest: int = NUM_NEAREST
    num_random: int = NUM_RANDOM
    max_partners: int = MAX_PARTNERS

    @property
    def max_size(self) -> int:
        return self.num_nearest + self.num_random + self.max_partners


def choose_neighbours(
    self_id: str,
    members: Iterable[str],
    predicted_rtt_ms: Mapping[str, float],
    partners: Iterable[str] = (),
    seed: int = 0,
    policy: NeighbourPolicy = NeighbourPolicy(),
) -> tuple[str, ...]:
    """At most policy.max_size live members to measure, sorted: the plan's `partners` (the
    first max_partners by id), the num_nearest members with the smallest predicted round trip
    (among those with a prediction; ties by id) and num_random others drawn with `seed` (a node
    passes its own seed and the rotation's number: the same inputs give the same set)."""
    candidates = sorted({m for m in members if m != self_id})
    chosen: set[str] = set()
    live = set(candidates)
    chosen.update(sorted(p for p in set(partners) if p in live)[: policy.max_partners])
    near = sorted(
        (p for p in candidates if p in predicted_rtt_ms and p not in chosen),
        key=lambda p: (predicted_rtt_ms[p], p),
    )
    chosen.update(near[: policy.num_nearest])
    rest = [p for p in candidates if p not in chosen]
    rng = random.Random(f"{self_id}/{seed}")
    chosen.update(rng.sample(rest, min(policy.num_random, len(rest))))
    return tuple(sorted(chosen))
