"""ComputeTrust (control/planning/trust.py) when a placed member reports no step at its place: a
plan was judged only once every trainer had reported there, so a member that claimed fast
compute and then stayed silent (or reported another place) was never judged, and re-pricing
(security rows 26.9, 32.6) never fired. Fake clock throughout."""

from __future__ import annotations

import dataclasses

from p2ptrain.control.planning.trust import (
    JUDGE_AFTER_S,
    SILENT_AFTER_S,
    ComputeTrust,
)
from p2ptrain.records import PeerMetrics, Plan

Pipelines = tuple[tuple[str, ...], ...]


def plan(pipelines: Pipelines, epoch: int = 1) -> Plan:
    return Plan(
        term=1,
        epoch=epoch,
        planner="h1",
        stages=len(pipelines[0]),
        pipelines=pipelines,
        spares=(),
        data_addrs={},
        cost_s=1.0,
        predicted_step_s=1.0,
    )


def reports(
    pipelines: Pipelines, step_s: dict[str, float], step: int
) -> dict[str, PeerMetrics | None]:
    """Each member in `step_s` reports `step` at its place, in `step_s` seconds."""
    return {
        peer: PeerMetrics(step=step, stage=stage, replica=replica, step_s=step_s[peer])
        for replica, pipeline in enumerate(pipelines)
        for stage, peer in enumerate(pipeline)
        if peer in step_s
    }


def run_plan(
    trust: ComputeTrust, pipelines: Pipelines, step_s: dict[str, float], epoch: int
) -> list[bool]:
    """One plan seen at 0, its reporters stepping (step 10, then 11 at JUDGE_AFTER_S + 5),
    looked at until SILENT_AFTER_S after that: what each look re-priced."""
    current, start = plan(pipelines, epoch), 1000.0 * epoch
    looks = [
        (0.0, 10),
        (JUDGE_AFTER_S, 10),
        (JUDGE_AFTER_S + 5, 11),
        (JUDGE_AFTER_S + 5 + SILENT_AFTER_S - 1, 11),
        (JUDGE_AFTER_S + 5 + SILENT_AFTER_S, 12),
    ]
    return [
        trust.observe(current, reports(pipelines, step_s, step), start + t) for t, step in looks
    ]


def test_a_silent_member_that_slows_its_pipeline_is_re_priced_and_frames_no_one() -> None:
    """`slow` claimed fast compute, is 4x slower and reports nothing: its mates' honest 4 s
    steps were never judged."""
    trust = ComputeTrust()
    two = (("slow", "h1"), ("h2", "h3"))
    looks = run_plan(trust, two, {"h1": 4.0, "h2": 1.0, "h3": 1.0}, epoch=1)
    assert looks == [False] * 5  # judged (h2-h3 as predicted; slow noted against h1)
    assert trust.factors == {}  # h1's lone word is not the pipeline's pace: no one framed
    assert set(trust.contradicted) == {"slow"}  # noted on its side only
    # silent beside a second mate, as a liar reporting fast steps would be: found out
    looks = run_plan(trust, (("h2", "slow"), ("h1", "h3")), {"h2": 4.0, "h1": 1.0, "h3": 1.0}, 2)
    assert looks[-1] and trust.factors == {"slow": 4.0}
    # in a pipeline of three, silent against two mates at once: re-priced in the first plan
    trust = ComputeTrust()
    assert run_plan(trust, (("h1", "slow", "h2"),), {"h1": 4.0, "h2": 4.0}, 1)[-1]
    assert trust.factors == {"h1": 4.0, "slow": 4.0, "h2": 4.0}  # most members' word stands


def test_a_report_at_another_place_counts_as_silence() -> None:
    trust = ComputeTrust()
    three = (("h1", "slow", "h2"),)
    current = plan(three)
    elsewhere = PeerMetrics(step=10, stage=0, replica=3, step_s=0.5)  # a place it does not hold
    for t, step in ((0.0, 10), (JUDGE_AFTER_S, 10), (JUDGE_AFTER_S + 1, 11)):
        metrics = {**reports(three, {"h1": 4.0, "h2": 4.0}, step), "slow": elsewhere}
        assert not trust.observe(current, metrics, t)
    metrics = {**reports(three, {"h1": 4.0, "h2": 4.0}, 12), "slow": elsewhere}
    assert trust.observe(current, metrics, JUDGE_AFTER_S + 1 + SILENT_AFTER_S)
    assert trust.factors["slow"] == 4.0


def test_silence_is_judged_only_once_the_pipeline_is_seen_stepping_under_the_plan() -> None:
    """A report matching the place may be an older plan's, and a session may take minutes to
    start (state transfers): silence counts only SILENT_AFTER_S after a mate's step moved."""
    trust = ComputeTrust()
    three = (("h1", "late", "h2"),)
    current = plan(three)
    stale = reports(three, {"h1": 4.0, "h2": 4.0}, 10)  # the previous plan's last steps
    for t in (0.0, JUDGE_AFTER_S, JUDGE_AFTER_S + 10 * SILENT_AFTER_S):
        assert not trust.observe(current, stale, t)
    assert trust.contradicted == {}  # not judged: nothing shows the pipeline steps
    # it steps: every member reports within the allowance, so the pipeline is judged whole
    moved = JUDGE_AFTER_S + 10 * SILENT_AFTER_S + 1
    assert not trust.observe(current, reports(three, {"h1": 1.0, "h2": 1.0}, 11), moved)
    everyone = reports(three, {"h1": 1.0, "h2": 1.0, "late": 1.0}, 12)
    assert not trust.observe(current, everyone, moved + SILENT_AFTER_S - 1)
    assert trust.factors == {} and trust.contradicted == {}


def test_a_fully_reported_pipeline_is_judged_without_waiting_for_a_silent_one() -> None:
    trust = ComputeTrust()
    two = (("h1", "h2"), ("h3", "quiet"))
    current = plan(two)
    metrics = reports(two, {"h1": 4.0, "h2": 4.0, "h3": 1.0}, 10)
    assert not trust.observe(current, metrics, 0.0)
    assert trust.observe(current, metrics, JUDGE_AFTER_S)  # h1-h2 ran 4x slow: judged now
    assert trust.factors == {"h1": 4.0, "h2": 4.0}
    assert not trust.observe(current, metrics, 2 * JUDGE_AFTER_S)  # once a pipeline
    assert trust.factors == {"h1": 4.0, "h2": 4.0}


def test_a_pipeline_of_one_with_nothing_reported_is_not_judged() -> None:
    trust = ComputeTrust()
    current = dataclasses.replace(plan((("solo",),)), stages=1)
    for t in (0.0, JUDGE_AFTER_S, 10 * JUDGE_AFTER_S):
        assert not trust.observe(current, {}, t)
    assert trust.factors == {} and trust.contradicted == {}
