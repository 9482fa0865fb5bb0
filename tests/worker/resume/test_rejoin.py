"""A volunteer that comes back to its stage after its stage-mate trained on past the kept
history (worker/resume/recency.py): the replicas' states share no step. The plan started at
step 0, each replica loading its own, different state, without a word; now the latest plan's
state is agreed (loudly), and a tie between two claims of one plan still changes nothing."""

from __future__ import annotations

from functools import partial

from p2ptrain.records import lineage as lin
from p2ptrain.worker.resume.start_choice import choose_start

X, Y = "a" * 16, "b" * 16
STAGE = "L0-4"
PLACED = {STAGE: {"back", "stayed"}}
ORDER = ["back", "stayed"]


def _states(
    tag: str, steps: range | tuple[int, ...], mark: str
) -> dict[str, dict[int, tuple[str, str]]]:
    return {STAGE: {step: (f"{mark}{step:02d}".ljust(64, "0"), tag) for step in steps}}


def test_the_stage_mate_that_trained_on_is_followed() -> None:
    rank = partial(lin.rank, ((X, 5),))  # the new plan: lineage X, epoch 5
    announced = {
        "back": _states(f"{X}-e1", (10, 15, 20, 21), "b"),  # stopped at 21, under epoch 1
        "stayed": _states(f"{X}-e3", (40, 45, 50, 54), "c"),  # trained on under epoch 3
    }
    start = choose_start(PLACED, announced, rank, ORDER, adopting=False)
    assert start.step == 54
    assert start.digests[STAGE] == announced["stayed"][STAGE][54][0]
    assert start.holders(STAGE, 54) == ["stayed"]  # the volunteer fetches it
    assert "share no step" in start.note  # said, at the restart's warning


def test_a_later_lineage_beats_an_ancestors() -> None:
    rank = partial(lin.rank, ((X, 2), (Y, 9)))  # X descends from Y (after Y's epoch 9)
    announced = {
        "back": _states(f"{Y}-e9", (60, 61), "b"),  # higher steps, but of the ancestor
        "stayed": _states(f"{X}-e1", (30, 35), "c"),
    }
    start = choose_start(PLACED, announced, rank, ORDER, adopting=False)
    assert start.step == 35 and start.holders(STAGE, 35) == ["stayed"]


def test_two_claims_of_one_plan_still_decide_nothing() -> None:
    """A member claiming the stage-mate's own plan for steps it made up wins nothing: neither
    state is later, and the start is what it was without this rule."""
    rank = partial(lin.rank, ((X, 5),))
    announced = {
        "back": _states(f"{X}-e3", (900, 1000), "f"),
        "stayed": _states(f"{X}-e3", (40, 45, 50, 54), "c"),
    }
    start = choose_start(PLACED, announced, rank, ORDER, adopting=False)
    assert start.step == 0 and not start.digests


def test_shared_steps_are_untouched_by_the_rule() -> None:
    """Stage-mates that share a step start there, as before (the rule runs only when a stage
    would have no state at all)."""
    rank = partial(lin.rank, ((X, 5),))
    announced = {
        "back": _states(f"{X}-e1", (15, 20), "b"),
        "stayed": {
            STAGE: {
                **_states(f"{X}-e1", (20,), "b")[STAGE],
                **_states(f"{X}-e3", (40,), "c")[STAGE],
            }
        },
    }
    start = choose_start(PLACED, announced, rank, ORDER, adopting=False)
    assert start.step == 20 and start.note == ""
