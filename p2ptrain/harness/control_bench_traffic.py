"""The control traffic a bench control run reports (control_bench.py): each peer's control bytes,
messages and probe bytes a second over its life in the simulation (peers that lived under 10 s
aside), as the median and max over the peers, and the median bytes a second of each kind sent."""

from __future__ import annotations

import statistics
from typing import Any

from p2ptrain.harness.control_sim import Simulation


def traffic_per_node(sim: Simulation, end: float) -> dict[str, Any]:
    """Per peer a second, until `end` or its leaving: its share of the swarm's control traffic."""
    bytes_per_s, messages_per_s, probes_per_s = [], [], []
    kinds = sorted(sim.counters.bytes_by_kind)
    by_kind: dict[str, list[float]] = {kind: [] for kind in kinds}
    for peer in sim.peers:
        alive_s = sim.left_at.get(peer.index, end) - peer.joined_at
        if alive_s < 10.0:
            continue
        bytes_per_s.append(sim.counters.control_bytes.get(peer.index, 0.0) / alive_s)
        messages_per_s.append(sim.counters.messages.get(peer.index, 0.0) / alive_s)
        probes_per_s.append(sim.counters.probe_bytes.get(peer.index, 0.0) / alive_s)
        for kind in kinds:
            by_kind[kind].append(sim.counters.bytes_by_kind[kind].get(peer.index, 0.0) / alive_s)
    return {
        "bytes_per_node_s": _spread(bytes_per_s, 0),
        "messages_per_node_s": _spread(messages_per_s, 2),
        "probe_bytes_per_node_s": _spread(probes_per_s, 0),
        "bytes_per_node_s_by_kind": {k: _spread(v, 0)["median"] for k, v in by_kind.items()},
    }


def _spread(values: list[float], digits: int) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "max": round(max(values), digits)}
