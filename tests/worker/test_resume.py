"""Choosing a new plan's start step from the members' announcements (worker/resume.py)."""

from p2ptrain.worker.resume import check_announcement, choose_start_step

NEEDED = ["L0-2", "L2-4"]


def test_a_fresh_run_starts_at_zero() -> None:
    assert choose_start_step(NEEDED, {"a": {}, "b": {}}).step == 0


def test_stages_one_step_apart_restart_from_the_older_step() -> None:
    # the last stage applied step 9 (it holds 9 and 10), the first stage was still in step 9
    held = {"a": {"L0-2": [8, 9]}, "b": {"L2-4": [9, 10]}, "c": {"L0-2": [8, 9]}}
    start = choose_start_step(NEEDED, held)
    assert start.step == 9 and start.note == ""


def test_the_answer_does_not_depend_on_who_announced_what() -> None:
    held = {"a": {"L0-2": [3, 4, 5]}, "b": {"L2-4": [4, 5, 6]}, "c": {"L9-9": [7]}}
    reordered = dict(reversed(list(held.items())))
    assert choose_start_step(NEEDED, held) == choose_start_step(NEEDED, reordered)
    assert choose_start_step(NEEDED, held).step == 5  # the unrelated L9-9 does not count


def test_a_stage_without_any_state_is_named_not_hidden() -> None:
    start = choose_start_step(NEEDED, {"a": {"L0-2": [4, 5]}})
    assert start.step == 5 and "L2-4" in start.note


def test_disjoint_histories_fall_back_to_the_oldest_newest_state() -> None:
    start = choose_start_step(NEEDED, {"a": {"L0-2": [1, 2]}, "b": {"L2-4": [7, 8]}})
    assert start.step == 2 and start.note


def test_announcements_off_the_wire_are_checked() -> None:
    assert check_announcement({"L0-2": [3, 1, 3]}, 40) == {"L0-2": [1, 3]}
    for bad in (None, [1], {"L0-2": "3"}, {"L0-2": [True]}, {"L0-2": [-1]}, {1: [1]},
                {"x" * 100: [1]}, {"L0-2": list(range(1000))}):  # fmt: skip
        assert check_announcement(bad, 40) is None


def test_an_announcement_at_or_past_the_last_step_is_refused() -> None:
    """Attack 4: one member announcing every stage at the run's last step made every worker
    skip training and exit as if the run were done."""
    assert check_announcement({"L0-2": [40], "L2-4": [40]}, 40) is None
    assert check_announcement({"L0-2": [39]}, 40) == {"L0-2": [39]}
