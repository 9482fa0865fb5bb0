"""`latest_history` (worker/resume/recency.py) answers as its definition does, comparing every
state with every other member's, but in one pass over the states: the pairwise form cost two
members announcing 256 keys × 64 steps each ~17 s of a worker's CPU in the start agreement."""

from __future__ import annotations

import random

from p2ptrain.worker.resume.announcement import Announced
from p2ptrain.worker.resume.covers import key_range
from p2ptrain.worker.resume.recency import Held, latest_history, span, written_under

RANKS = {None: 2, "a": 0, "b": 1}


def rank(tag: str | None) -> int | None:
    return RANKS.get(tag)  # "c": a tag the plan may not use


def by_definition(announced: dict[str, Announced]) -> dict[str, Held]:
    """Each member's usable states, less those whose blocks another member holds a state of
    under a later plan: every pair compared."""
    usable = [
        (peer, key, step, digest, written_under(tag, position))
        for peer, announcement in announced.items()
        for key, steps in announcement.items()
        for step, (digest, tag) in steps.items()
        if (position := rank(tag)) is not None and key_range(key) is not None
    ]
    kept: dict[str, Held] = {}
    for peer, key, step, digest, order in usable:
        mine = key_range(key)
        assert mine is not None
        overtaken = False
        for other_peer, other_key, _, _, other in usable:
            theirs = key_range(other_key)
            assert theirs is not None
            if other_peer != peer and other > order:
                overtaken |= mine.start < theirs.stop and theirs.start < mine.stop
        if not overtaken:
            kept.setdefault(peer, {}).setdefault(key, {})[step] = digest
    return kept


def test_one_pass_answers_as_the_definition() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        announced: dict[str, Announced] = {}
        for peer in range(rng.randint(1, 4)):
            announcement: Announced = {}
            for _ in range(rng.randint(0, 4)):
                start = rng.randint(0, 5)
                key = f"L{start}-{rng.randint(start + 1, 6)}"
                announcement[key] = {
                    rng.randint(0, 9): (f"d{rng.randint(0, 3)}", rng.choice([None, "a", "b", "c"]))
                    for _ in range(rng.randint(1, 3))
                }
            announced[f"P{peer}"] = announcement
        assert latest_history(announced, rank) == by_definition(announced)


def test_a_block_held_latest_by_two_others_overtakes_each_of_theirs_only_once() -> None:
    """Three holders of one block: the latest keeps its state, whatever order they come in."""
    announced: dict[str, Announced] = {
        "early": {"L0-2": {5: ("e", None)}},
        "middle": {"L0-2": {5: ("m", "b")}},
        "late": {"L1-2": {3: ("l", "a")}},
    }
    assert latest_history(announced, rank) == {"late": {"L1-2": {3: "l"}}}


def test_a_keys_blocks_count_within_the_plans_only() -> None:
    """A key's format allowed "L0-999999": every block of it was walked, a million a state
    (~80 s of a worker's CPU a key of 64 steps); blocks past the plan's are not looked at."""
    announced: dict[str, Announced] = {
        "huge": {"L0-999999": {step: ("h", "b") for step in range(64)}},
        "honest": {"L0-2": {5: ("d", "a")}, "L2-4": {5: ("e", "a")}},
    }
    within = span(["L0-2", "L2-4"])
    assert within == range(0, 4)
    kept = latest_history(announced, rank, within)  # in ms: 64 states of 4 blocks
    assert kept == {"honest": {"L0-2": {5: "d"}, "L2-4": {5: "e"}}}  # its plan is the later
