"""Whose announcements count when a restarted swarm adopts an earlier lineage (attack 29.11,
worker/resume/start_choice.py choose_start, worker/resume/covers.py): a lineage tag is only the
announcer's word, so a lone member's made-up lineage counts only for blocks nobody else holds
in any lineage. It used to be judged against its own states alone: a spare announcing a fake
lineage at step 900 won over the two members' real step 5, and everyone fetched its files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from p2ptrain.records import Plan
from p2ptrain.records.lineage import next_lineage
from p2ptrain.worker.resume.adopt import LINEAGES_PER_MEMBER, candidates
from p2ptrain.worker.resume.announcement import Announced
from p2ptrain.worker.resume.restore import started_line
from p2ptrain.worker.resume.start_choice import StartPoint, choose_start, placement
from tests.worker.resume.test_recut import SPEC
from tests.worker.resume.test_resume import d

X, Y, FAKE = "1" * 16, "2" * 16, "f" * 16  # earlier swarms' lineages, and a made-up one
BOTH = ("L0-2", "L2-4")


def new_plan(pipelines: tuple[tuple[str, ...], ...], spares: tuple[str, ...] = ()) -> Plan:
    """A restarted swarm's first plan: a new root, which may adopt."""
    return Plan(
        term=1,
        epoch=1,
        planner="P",
        stages=2,
        pipelines=pipelines,
        spares=spares,
        data_addrs={},
        cost_s=0.0,
        lineage=next_lineage((), False, 1, 1, "P"),
    )


A_B_SPARE_C = new_plan((("a", "b"),), ("c",))


def states(lineage: str, step: int, *keys: str, who: str = "") -> Announced:
    """States of `keys` at `step` saved under `lineage` (the digest names them, and `who`
    made them if not the lineage's honest training)."""
    return {key: {step: (d(f"{lineage}{key}@{step}{who}"), f"{lineage}-e3")} for key in keys}


def merged(*parts: Announced) -> Announced:
    found: Announced = {}
    for part in parts:
        for key, steps in part.items():
            found.setdefault(key, {}).update(steps)
    return found


def start_of(plan: Plan, announced: dict[str, Announced]) -> StartPoint:
    members, placed = placement(plan, SPEC.model.n_layer)
    return choose_start(placed, announced, plan.state_rank, members, adopting=True)


def test_a_lone_spare_s_made_up_lineage_does_not_outbid_the_members_real_one() -> None:
    """The reviewer's scenario: a and b hold lineage X at step 5; spare c alone announces a
    made-up lineage naming every stage at step 900 (and no state of the plan's lineage)."""
    honest = states(X, 5, *BOTH)
    fake = states(FAKE, 900, *BOTH, who="c")
    start = start_of(A_B_SPARE_C, {"a": honest, "b": honest, "c": fake})
    assert (start.step, start.adopted, start.note) == (5, X, "")
    assert start.digests == {key: honest[key][5][0] for key in BOTH}
    assert start.holders("L0-2", 5) == ["a", "b"]
    # the same holds if c holds X too, or is the one the plan places at a stage's replica
    start = start_of(A_B_SPARE_C, {"a": honest, "b": honest, "c": merged(honest, fake)})
    assert (start.step, start.adopted) == (5, X)
    two = new_plan((("a", "b"), ("c", "e")))
    start = start_of(two, {"a": honest, "b": honest, "c": fake, "e": {}})
    assert (start.step, start.adopted) == (5, X)


def test_a_lone_member_cannot_fill_a_lost_stage_to_drop_the_others_states() -> None:
    """X's L2-4 is lost; c's made-up lineage names it (nobody contests that) and L0-2 at 900:
    the swarm keeps a's and b's L0-2 and starts L2-4 fresh, rather than the reverse; and a
    lineage whose every state is contested is no candidate (not a start from scratch)."""
    honest = states(X, 5, "L0-2")
    fake = states(FAKE, 900, *BOTH, who="c")
    start = start_of(A_B_SPARE_C, {"a": honest, "b": honest, "c": fake})
    assert (start.step, start.adopted) == (5, X)
    assert start.digests == {"L0-2": honest["L0-2"][5][0]}
    assert "no saved state for L2-4" in start.note
    contested = states(FAKE, 900, "L0-2", who="c")
    start = start_of(A_B_SPARE_C, {"a": honest, "b": honest, "c": contested})
    assert (start.step, start.adopted) == (5, X)


def test_a_stage_only_one_member_holds_is_still_adopted_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The documented residual (docs/security.md, "Not defended yet", 4b): a member that alone
    holds a stage's states decides that stage's state, and the adoption is logged as a warning."""
    start = start_of(
        A_B_SPARE_C,
        {"a": states(X, 5, "L0-2"), "b": states(X, 5, "L0-2"), "c": states(X, 5, "L2-4")},
    )
    assert (start.step, start.adopted, start.note) == (5, X, "")
    assert start.digests["L2-4"] == states(X, 5, "L2-4")["L2-4"][5][0]
    assert start.holders("L2-4", 5) == ["c"]
    # nobody else holds any state at all: c's lineage, whatever it is, is adopted
    start = start_of(A_B_SPARE_C, {"a": {}, "b": {}, "c": states(FAKE, 900, *BOTH, who="c")})
    assert (start.step, start.adopted) == (900, FAKE)
    with caplog.at_level(logging.WARNING):
        line = started_line(SPEC, A_B_SPARE_C, start, Path("/nonexistent"))
    assert line == f"resumed from step 900 (lineage {FAKE})" and line in caplog.text


def test_honest_restarts_still_take_the_newest_state_held_by_several() -> None:
    """A newer lineage two members hold wins over an older one all three hold; after a re-cut
    between swarms, a member's stale state of another lineage does not contest the newer
    holder's (each member's blocks now are those at its own newest step, of any lineage)."""
    older, newer = states(X, 5, *BOTH), states(Y, 9, *BOTH)
    start = start_of(
        A_B_SPARE_C, {"a": merged(older, newer), "b": merged(older, newer), "c": older}
    )
    assert (start.step, start.adopted) == (9, Y)
    # swarm X: a held L0-2, b L2-4; swarm Y swapped them (b fetched L0-2 under Y's tag)
    a = merged(states(X, 5, "L0-2"), states(Y, 9, "L2-4"))
    b = merged(states(X, 5, "L2-4"), states(Y, 9, "L0-2"))
    start = start_of(new_plan((("a", "b"),)), {"a": a, "b": b})
    assert (start.step, start.adopted, start.note) == (9, Y, "")


def test_a_partition_s_two_halves_still_compare_by_step() -> None:
    """Each half's lineage is held by two members: the newer one is adopted, as before."""
    left, right = states(X, 7, *BOTH), states(Y, 8, *BOTH)
    plan = new_plan((("a", "b"), ("c", "e")))
    start = start_of(plan, {"a": left, "b": left, "c": right, "e": right})
    assert (start.step, start.adopted) == (8, Y)


def test_a_member_s_thousands_of_made_up_lineages_cost_a_few_candidates() -> None:
    """Each candidate lineage is judged against every announced state: a spare announcing 4,096
    lineages made the agreement quadratic (minutes of CPU on every member). Only each member's
    LINEAGES_PER_MEMBER newest count, and the members' real lineage still wins."""
    honest = states(X, 5, *BOTH)
    flood = merged(*(states(f"{n:016x}", 1000 + n, "L0-2", who="c") for n in range(4096)))
    announced = {"a": honest, "b": honest, "c": flood}
    rank = A_B_SPARE_C.state_rank
    lineages = [lineage for lineage, _ in candidates(announced, rank)]
    assert lineages[0] == "" and X in lineages
    assert len(lineages) == 1 + 1 + LINEAGES_PER_MEMBER  # ours, X, and c's newest four
    start = start_of(A_B_SPARE_C, announced)
    assert (start.step, start.adopted) == (5, X)
