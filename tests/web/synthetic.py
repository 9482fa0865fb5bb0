"""Synthetic status documents: a swarm of any size, for the dashboard's tests."""

from __future__ import annotations

import os

from p2ptrain import identity
from p2ptrain.records import LinkStatus, PeerMetrics, PeerStatus, PlanSummary, SwarmStatus


def peer_ids(count: int, seed: int = 0) -> list[str]:
    return sorted(
        identity.peer_id_of(bytes([seed, i % 256, i // 256]) * 10 + b"xy") for i in range(count)
    )


def swarm(
    count: int,
    stages: int = 4,
    step: int = 10,
    dead: frozenset[str] = frozenset(),
    ids: list[str] | None = None,
    term: int = 1,
    epoch: int = 1,
    reason: str = "first",
) -> SwarmStatus:
    """`count` peers in (count // stages) pipelines of `stages` (the rest spares), every pair
    of them measured, each placed peer at `step` with a loss."""
    ids = ids or peer_ids(count)
    replicas = count // stages
    pipelines = tuple(tuple(ids[r * stages + j] for j in range(stages)) for r in range(replicas))
    where = {p: (r, j) for r, pipe in enumerate(pipelines) for j, p in enumerate(pipe)}
    peers = []
    for i, peer in enumerate(ids):
        metrics = None
        if peer in where:
            r, j = where[peer]
            metrics = PeerMetrics(
                step=step,
                loss=5.0 - 0.01 * step if j == stages - 1 else None,
                tokens_per_s=100.0 + i,
                stage=j,
                replica=r,
                bytes_sent=1000 * i,
                bytes_received=2000 * i,
                step_s=0.5,
                averaging={"averaged": step},
                control_bytes_sent=10 * i,
                control_bytes_received=20 * i,
            )
        peers.append(
            PeerStatus(
                id=peer,
                alive=peer not in dead,
                planner=i == 0,
                role="trainer",
                addrs=(f"/ip4/10.0.{i // 256}.{i % 256}/tcp/7401/p2p/{peer}",),
                data_addrs=(f"/ip4/10.0.{i // 256}.{i % 256}/tcp/7402",),
                version="0.1.0",
                hardware={"cpus": 2},
                compute_gflops=10.0,
                last_seen_s=0.5,
                penalty=0.0,
                metrics=metrics,
                reachability="private" if i % 4 == 3 else "public",
            )
        )
    links = tuple(
        LinkStatus(
            a,
            b,
            rtt_ms=1.0 + (i * 7 + k * 3) % 200,
            bandwidth_mbps=10.0 + (i + k) % 90,
            age_s=float((i + k) % 30),
        )
        for i, a in enumerate(ids)
        for k, b in enumerate(ids)
        if a < b
    )
    plan = PlanSummary(
        term=term,
        epoch=epoch,
        planner=ids[0],
        stages=stages,
        pipelines=pipelines,
        spares=tuple(ids[replicas * stages :]),
        cost_s=1.25,
        reason=reason,
        previous_cost_s=None if reason == "first" else 2.5,
        predicted_step_s=0.55,
    )
    return SwarmStatus(
        run="synthetic",
        planner=ids[0],
        peers=tuple(peers),
        links=links,
        plan=plan,
        observed_by=ids[0],
        telemetry_age_s={},
        bootstrap=None,
        term=term,
    )


def random_ids(count: int) -> list[str]:
    return sorted(identity.peer_id_of(os.urandom(32)) for _ in range(count))
