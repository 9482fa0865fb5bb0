"""Topologies built from the measured city-to-city matrix (data/region_links.json), for scaling runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from p2ptrain.schedule.topology import PAPER_WORKLOAD, Topology, TopologyError, Workload

REGION_LINKS = Path(__file__).resolve().parent.parent / "data" / "region_links.json"


def load_region_links(
    path: Path = REGION_LINKS,
) -> tuple[list[str], np.ndarray, np.ndarray, float, float]:
    """(cities, delay_ms, bandwidth_gbps, intra-city delay, intra-city bandwidth)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    cities = list(doc["cities"])
    index = {c: i for i, c in enumerate(cities)}
    intra = doc["intra_region"]
    delay = np.full((len(cities), len(cities)), float(intra["delay_ms"]))
    bandwidth = np.full((len(cities), len(cities)), float(intra["bandwidth_gbps"]))
    for link in doc["links"]:
        a, b = index[link["a"]], index[link["b"]]
        delay[a, b] = delay[b, a] = float(link["delay_ms"])
        bandwidth[a, b] = bandwidth[b, a] = float(link["bandwidth_gbps"])
    return cities, delay, bandwidth, float(intra["delay_ms"]), float(intra["bandwidth_gbps"])


def paper_workload(stages: int, replicas: int) -> Workload:
    """The paper's GPT-3 XL sizes re-cut: gradients per stage scale with 1/stages, activations per
    replica with 1/replicas (the global batch is fixed)."""
    base = PAPER_WORKLOAD
    return Workload(
        stages,
        replicas,
        base.c_dp_gb * base.stages / stages,
        base.c_pp_gb * base.replicas / replicas,
    )


def city_topology(
    num_peers: int, stages: int, replicas: int, seed: int = 0, cities: list[str] | None = None
) -> Topology:
    """num_peers peers spread over the cities (uneven counts, drawn from ``seed``), listed shuffled."""
    all_cities, delay, bandwidth, _, _ = load_region_links()
    chosen = cities or all_cities
    unknown = set(chosen) - set(all_cities)
    if unknown:
        raise TopologyError(f"unknown cities: {', '.join(sorted(unknown))}")
    rng = np.random.default_rng(seed)
    city_idx = np.array([all_cities.index(c) for c in chosen])
    weights = rng.uniform(0.5, 1.5, size=len(chosen))
    assignment = city_idx[rng.choice(len(chosen), size=num_peers, p=weights / weights.sum())]
    order = rng.permutation(num_peers)
    assignment = assignment[order]
    names = [f"{all_cities[c]}-{i}" for i, c in enumerate(assignment)]
    return Topology(
        peers=names,
        delay_ms=delay[np.ix_(assignment, assignment)],
        bandwidth_gbps=bandwidth[np.ix_(assignment, assignment)],
        regions=[all_cities[c] for c in assignment],
        workload=paper_workload(stages, replicas),
        name=f"cities-{num_peers}",
        source="built from data/region_links.json",
    )
