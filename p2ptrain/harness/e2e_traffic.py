"""Bytes per link for `bench e2e`: what the traffic model predicts a plan moves per step, and
what the workers counted (their metrics logs' cumulative `bytes_sent` / `link_bytes`).

Predicted, per directed link a -> b and step (the same traffic the step-time model prices):
- pipeline: a replica's activations forward across each boundary and their gradients back,
  rows x block_size x n_embd values each way;
- averaging: within a stage's group of R replicas, hivemind's all-reduce sends 1/R of the
  stage's gradient to every other member and 1/R of the average back: 2 G / R per ordered pair.
Stdlib only (the metrics logs are JSON lines; fields the worker does not write yet are absent).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Link = tuple[int, int]


def predicted_link_bytes(
    pipelines: Sequence[Sequence[int]],
    stage_gradient_bytes: Sequence[float],
    replica_rows: Sequence[int],
    row_activation_bytes: float,
) -> dict[Link, float]:
    """Bytes per directed link per step for pipelines of peer indices (replica r trains on
    replica_rows[r] rows; one row's activations at one boundary are row_activation_bytes)."""
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
        for a in group:
            for b in group:
                add(a, b, 2 * gradient / replicas)
    return links


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The metrics reports of one worker's log (join --metrics-log), as raw JSON objects."""
    reports = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("type") == "metrics":
            reports.append(doc)
    return reports


def measured_link_bytes(
    logs: Sequence[Path], peer_ids: Sequence[str], plan_key: tuple[int, int]
) -> tuple[dict[Link, float], dict[str, float]] | None:
    """Bytes per directed link per step, counted by the senders between their first and last
    report under the plan `plan_key` (term, epoch), and each peer's total sent per step; None
    when the workers do not count bytes. Per step: the counters also hold the measuring and
    connecting that came before the plan, which the window leaves out."""
    index = {p: i for i, p in enumerate(peer_ids)}
    links: dict[Link, float] = {}
    sent: dict[str, float] = {}
    counted = False
    for a, path in enumerate(logs):
        mine = [
            r
            for r in read_metrics(path)
            if (r.get("term"), r.get("epoch")) == plan_key and "bytes_sent" in r
        ]
        if len(mine) < 2 or mine[-1]["step"] <= mine[0]["step"]:
            continue
        counted = True
        first, last = mine[0], mine[-1]
        steps = last["step"] - first["step"]
        sent[peer_ids[a]] = (last["bytes_sent"] - first["bytes_sent"]) / steps
        before = first.get("link_bytes") or {}
        for peer, counts in (last.get("link_bytes") or {}).items():
            if peer in index and isinstance(counts, dict):
                was = before.get(peer, {}).get("sent", 0)
                links[(a, index[peer])] = (counts.get("sent", 0) - was) / steps
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
