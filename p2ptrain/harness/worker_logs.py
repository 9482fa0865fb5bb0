"""A worker's metrics log (`join --metrics-log`, JSON lines) read back as records: its steps'
MetricsReports and, from a worker started with `join --profile`, their StepProfiles. Lines that
hold no valid record (a line cut by a crash, a newer worker's kind) are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from p2ptrain.records import Message, MetricsReport, StepProfile, message_from_dict


def read_log(path: Path) -> list[Message]:
    """Every record of one worker's log, in order ([] if it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(message_from_dict(json.loads(line)))
        except (ValueError, RecursionError):  # not JSON, or no valid record (WireError)
            continue
    return records


def read_metrics(path: Path) -> list[MetricsReport]:
    """The metrics reports of one worker's log, in order."""
    return [r for r in read_log(path) if isinstance(r, MetricsReport)]


@dataclass(frozen=True)
class ProfiledStep:
    """One step's metrics and its profile (None: the worker did not profile it)."""

    metrics: MetricsReport
    profile: StepProfile | None


def read_steps(path: Path, plan_key: tuple[int, int]) -> list[ProfiledStep]:
    """The steps one worker reported under the plan `plan_key` (term, epoch), in order, each
    with the profile it reported for it."""
    records = read_log(path)
    profiles = {
        (r.plan_key, r.step): r
        for r in records
        if isinstance(r, StepProfile) and r.plan_key == plan_key
    }
    return [
        ProfiledStep(r, profiles.get((r.plan_key, r.step)))
        for r in records
        if isinstance(r, MetricsReport) and r.plan_key == plan_key
    ]
