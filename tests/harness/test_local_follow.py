"""`p2ptrain local` follows the workers' metrics logs (harness/local_run.py: _follow): the
swarm's tokens/s over a few steps, read in one poll, is the workers' own rate, not the steps
over a few milliseconds between two reads (a 3-step run reported 39 M tokens/s)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from p2ptrain.harness import local_run
from p2ptrain.records import MetricsReport, Plan, RunSpec, SessionReport
from tests.records.samples import metrics_dict, plan_dict


def test_a_short_runs_rate_is_the_workers_own(tmp_path: Path) -> None:
    plan = Plan.from_dict(plan_dict())  # one pipeline: a replica of two stages
    spec = RunSpec().replace(steps=3)
    base = MetricsReport.from_dict(metrics_dict())
    lines = [SessionReport(plan, 0).to_dict()]
    for step, rate in enumerate((900.0, 1000.0, 1100.0)):
        report = dataclasses.replace(
            base, step=step, tokens_per_s=rate, term=plan.term, epoch=plan.epoch, num_replicas=1
        )
        lines.append(report.to_dict())
    log = tmp_path / "metrics-0.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    steps: list[int] = []
    result = local_run._follow(
        spec, [log], [], [], lambda p: None, lambda s, loss, r: steps.append(s)
    )
    assert steps == [0, 1, 2] and result.steps == 3
    assert result.tokens_per_s == pytest.approx(1000.0)  # the median step's
    assert result.outer_rounds == {}  # sync = "step"


def test_a_diloco_runs_outer_rounds_are_counted_as_applied(tmp_path: Path) -> None:
    """Its steps' averaging is "solo": the summary said only `averaging {'solo': 160}`."""
    plan = Plan.from_dict(plan_dict())
    spec = RunSpec().replace(steps=4)
    base = MetricsReport.from_dict(metrics_dict())
    lines = [SessionReport(plan, 0).to_dict()]
    for step, outer in enumerate(("", "started", "", "averaged")):
        report = dataclasses.replace(
            base,
            step=step,
            averaging="solo",
            outer_round=outer,
            term=plan.term,
            epoch=plan.epoch,
            num_replicas=1,
        )
        lines.append(report.to_dict())
    log = tmp_path / "metrics-0.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = local_run._follow(spec, [log], [], [], lambda p: None, lambda s, loss, r: None)
    assert result.averaging == {"solo": 4}
    assert result.outer_rounds == {"averaged": 1}  # started, then applied: one round


def test_local_refuses_flags_it_would_ignore_before_making_anything(tmp_path: Path) -> None:
    from p2ptrain.app import main

    workdir = tmp_path / "work"
    argv = ["local", "--workdir", str(workdir), "--peers", "1", "--steps", "1"]
    assert main([*argv, "--bandwidth-scale", "0.1"]) == 2  # scales nothing without --emulate
    assert main([*argv, "--direct", "--control-plane"]) == 2
    assert not workdir.exists()
