"""Bytes per link for `bench e2e`: what the traffic model predicts a plan moves per step, and
what the workers counted (their metrics logs' cumulative `bytes_sent` / `link_bytes`).

Predicted, per directed link a -> b and step (the same traffic the step-time model prices):
- pipeline: a replica's activations forward across each boundary and their gradients back,
  rows x block_size x n_embd values each way;
- averaging: within a stage's group of R replicas, hivemind's all-reduce sends 1/R of the
  stage's gradient to every other member and 1/R of the average back: 2 G / R per ordered pair.
  Under diloco G is a member's compressed pseudo-gradient and one exchange serves H steps
  (2 G / R / H a step); a top-k exchange is a sparse gather, every member's whole payload to
  every other (G / H a step).
Stdlib only (the metrics logs are read as records: harness/worker_logs.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2ptrain.harness.worker_logs import read_metrics
from p2ptrain.records import LinkBytes

Link = tuple[int, int]


def predicted_link_bytes(
    pipelines: Sequence[Sequence[int]],
    stage_gradient_bytes: Sequence[float],
    replica_rows: Sequence[float],
    row_activation_bytes: float,
    inner_steps: int = 0,
    sparse_gather: bool = False,
) -> dict[Link, float]:
    """Bytes per directed link per step for pipelines of peer indices (replica r trains on
    replica_rows[r] rows; one row's activations at one boundary are row_activation_bytes);
    stage_gradient_bytes: what one member puts in one exchange, every step (inner_steps 0) or
    every inner_steps steps (diloco; StepTraffic's fields)."""
    links: dict[Link, float] = {}

    def add(a: int, b: int, size: float) -> None:
        if a != b:
            links[(a, b)] = links.get((a, b), 0.0) + size

    for pipe, rows in zip(pipelines, replica_rows, strict=True):
        for a, b in itertools.pairwise(pipe):
            add(a, b, rows * row_activation_bytes)  # forward: activations
            add(b, a, rows * row_activation_bytes)  # backward: their gradients
    replicas = len(pipelines)
    for stage, gradient in enumerate(stage_gradient_bytes):
        group = [pipe[stage] for pipe in pipelines]
        pair = gradient if sparse_gather else 2 * gradient / replicas
        for a in group:
            for b in group:
                add(a, b, pair / max(1, inner_steps))
    return links


def dp_bytes(links: dict[Link, float], pipelines: Sequence[Sequence[int]]) -> float:
    """The data-parallel part of `links` (bytes per step): links between two members of one
    stage's group. They carry no pipeline frames (a peer holds one place in one pipeline)."""
    stage_of = {peer: stage for pipe in pipelines for stage, peer in enumerate(pipe)}
    return sum(
        size
        for (a, b), size in links.items()
        if a in stage_of and b in stage_of and stage_of[a] == stage_of[b]
    )


def measured_link_bytes(
    logs: Sequence[Path], peer_ids: Sequence[str], plan_key: tuple[int, int]
) -> tuple[dict[Link, float], dict[str, float]] | None:
    """Bytes per directed link per step, counted by the senders between their first and last
    report under the plan `plan_key` (term, epoch), and each peer's total sent per step; None
    when no worker reported two steps of it. Per step: the counters also hold the measuring and
    connecting that came before the plan, which the window leaves out."""
    index = {p: i for i, p in enumerate(peer_ids)}
    links: dict[Link, float] = {}
    sent: dict[str, float] = {}
    counted = False
    for a, path in enumerate(logs):
        mine = [r for r in read_metrics(path) if r.plan_key == plan_key]
        if len(mine) < 2 or mine[-1].step <= mine[0].step:
            continue
        counted = True
        first, last = mine[0], mine[-1]
        steps = last.step - first.step
        sent[peer_ids[a]] = (last.bytes_sent - first.bytes_sent) / steps
        for peer, counts in last.link_bytes.items():
            if peer in index:
                was = first.link_bytes.get(peer, LinkBytes()).sent
                links[(a, index[peer])] = (counts.sent - was) / steps
    return (links, sent) if counted else None


def link_table(
    predicted: dict[Link, float], measured: dict[Link, float] | None, steps: int
) -> list[dict[str, Any]]:
    """The JSON rows of every link either side names: bytes per step and over `steps` steps."""
    rows = []
    for a, b in sorted(set(predicted) | set(measured or {})):
        p = predicted.get((a, b), 0.0)
        m = None if measured is None else measured.get((a, b), 0.0)
        rows.append(
            {
                "link": [a, b],
                "predicted_bytes_per_step": round(p),
                "measured_bytes_per_step": None if m is None else round(m),
                "predicted_bytes": round(p * steps),
                "measured_bytes": None if m is None else round(m * steps),
            }
        )
    return rows
