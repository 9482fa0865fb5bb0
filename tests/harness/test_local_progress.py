"""`p2ptrain local`'s progress line (issue 28): under diloco it shows the outer rounds every
stage has applied; on one machine the run says its peers share the cores; the last line counts
the rounds' outcomes in words."""

from __future__ import annotations

import io

from p2ptrain.harness.cli.local_cmd import shared_cores_note
from p2ptrain.harness.direct_swarm import SwarmResult
from p2ptrain.harness.local_progress import Progress, done_line
from p2ptrain.records import MetricsReport, Plan


def report(stage: int, replica: int, outer_steps: int | None) -> MetricsReport:
    return MetricsReport(
        step=5,
        loss=None,
        tokens_per_s=1.0,
        stage=stage,
        replica=replica,
        samples=8,
        averaging="solo",
        step_s=1.0,
        epoch=1,
        term=1,
        num_replicas=2,
        outer_steps=outer_steps,
        inner_steps=None if outer_steps is None else 10,
    )


def plan() -> Plan:
    return Plan.from_dict(
        {
            "term": 1,
            "epoch": 1,
            "planner": "p",
            "stages": 2,
            "pipelines": [["a", "b"], ["c", "d"]],
            "spares": [],
            "data_addrs": {},
            "cost_s": 1.0,
        }
    )


def test_the_line_shows_the_outer_rounds_every_stage_applied() -> None:
    out = io.StringIO()
    progress = Progress(20, out)
    progress.on_plan(plan())
    for stage, replica, outer in ((0, 0, 2), (0, 1, 2), (1, 0, 1), (1, 1, 1)):
        progress.on_report(report(stage, replica, outer))
    progress.on_step(5, 4.5, 300.0)
    assert out.getvalue().splitlines()[-1].endswith("plan 2x2  outer 1 (H 10)")
    progress.on_report(report(1, 0, 2))  # stage 1's next round: now both stages applied 2
    progress.on_step(6, 4.4, 300.0)
    assert out.getvalue().splitlines()[-1].endswith("outer 2 (H 10)")


def test_every_step_averaging_shows_no_outer_rounds() -> None:
    out = io.StringIO()
    progress = Progress(20, out)
    progress.on_plan(plan())
    progress.on_report(report(0, 0, None))
    progress.on_step(0, 5.5, 100.0)
    assert out.getvalue().splitlines()[-1].endswith("plan 2x2")


def test_the_run_says_its_peers_share_the_machine() -> None:
    note = shared_cores_note(4)
    assert "4 peers share this machine's" in note and "not the speed-up" in note


def test_the_last_line_counts_the_rounds_outcomes_in_words() -> None:
    result = SwarmResult(
        steps=40,
        loss=[5.537, 2.867],
        tokens_per_s=3760.4,
        plan=plan(),
        averaging={"solo": 150, "local": 10},
        wall_s=37.0,
        outer_rounds={"averaged": 14},
    )
    assert done_line(result, 37.2) == (
        "done: 40 steps in 37 s, loss 5.537 -> 2.867, 3760 tokens/s, "
        "averaging: 150 solo, 10 local; outer rounds: 14 averaged"
    )
    every_step = SwarmResult(40, [5.5, 2.9], 1.0, plan(), {}, 1.0)
    assert done_line(every_step, 1.0).endswith("averaging: none")  # no report: said, not blank
