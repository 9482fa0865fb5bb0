"""Choosing a new plan's start step from the members' signed announcements (worker/resume/start_choice.py)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from p2ptrain import identity
from p2ptrain.worker.resume.announcement import Announced, check_announcement, sign_announcement
from p2ptrain.worker.resume.covers import cover
from p2ptrain.worker.resume.own_states import Held
from p2ptrain.worker.resume.start_choice import choose_start_step

NEEDED = ["L0-2", "L2-4"]
KEY = "p2ptrain_r_resume_t1_e3"


def d(name: str) -> str:
    """A digest standing for one state file's bytes."""
    return hashlib.sha256(name.encode()).hexdigest()


def steps(key: str, *numbers: int, tag: str = "") -> Held:
    """An announcement of `key` at `numbers`, each state's digest named by its step (and tag:
    two peers with the same tag hold the same bytes)."""
    return {key: {n: d(f"{key}@{n}{tag}") for n in numbers}}


def root(held: Held) -> Announced:
    """`held` as announced: every state of the root lineage (untagged)."""
    return {
        key: {step: (digest, None) for step, digest in steps.items()} for key, steps in held.items()
    }


def test_a_fresh_run_starts_at_zero() -> None:
    assert choose_start_step(NEEDED, {"a": {}, "b": {}}).step == 0


def test_stages_one_step_apart_restart_from_the_older_step() -> None:
    # the last stage applied step 9 (it holds 9 and 10), the first stage was still in step 9
    held = {"a": steps("L0-2", 8, 9), "b": steps("L2-4", 9, 10), "c": steps("L0-2", 8, 9)}
    start = choose_start_step(NEEDED, held, {"L0-2": {"a", "c"}, "L2-4": {"b"}})
    assert start.step == 9 and start.note == ""
    assert start.digests == {"L0-2": d("L0-2@9"), "L2-4": d("L2-4@9")}
    assert start.holders("L0-2", 9) == []  # held was not attached: replace() in agree_on_start


def test_the_answer_does_not_depend_on_who_announced_what() -> None:
    held = {"a": steps("L0-2", 3, 4, 5), "b": steps("L2-4", 4, 5, 6), "c": steps("L9-9", 7)}
    reordered = dict(reversed(list(held.items())))
    assert choose_start_step(NEEDED, held) == choose_start_step(NEEDED, reordered)
    assert choose_start_step(NEEDED, held).step == 5  # the unrelated L9-9 does not count


def test_a_stage_without_any_state_is_named_not_hidden() -> None:
    start = choose_start_step(NEEDED, {"a": steps("L0-2", 4, 5)})
    assert start.step == 5 and "L2-4" in start.note


def test_disjoint_histories_fall_back_to_the_oldest_newest_state() -> None:
    start = choose_start_step(NEEDED, {"a": steps("L0-2", 1, 2), "b": steps("L2-4", 7, 8)})
    assert start.step == 2 and start.note


def test_a_lone_member_announcing_newer_steps_of_every_stage_does_not_move_the_start() -> None:
    """Attack 4b: member x (placed at neither stage, e.g. a spare) announced every stage at a
    newer step, with states it crafted: everyone fetched and trained on them."""
    honest = {"a": steps("L0-2", 8, 9), "b": steps("L2-4", 8, 9)}
    crafted = {
        "L0-2": {9: d("crafted0@9"), 10: d("crafted0@10")},
        "L2-4": {9: d("crafted1@9"), 10: d("crafted1@10")},
    }
    held = {**honest, "x": crafted}
    placed = {"L0-2": {"a"}, "L2-4": {"b"}}
    start = choose_start_step(NEEDED, held, placed, ["a", "b", "x"])
    assert start.step == 9
    # x also claims step 9 with other bytes: one vote each, the member the plan placed at the
    # stage wins the tie, whatever the digests or peer ids
    assert start.digests == {"L0-2": d("L0-2@9"), "L2-4": d("L2-4@9")}
    start = choose_start_step(NEEDED, held, placed, ["x", "a", "b"])
    assert start.digests == {"L0-2": d("L0-2@9"), "L2-4": d("L2-4@9")}


def test_a_minority_digest_loses_to_the_one_most_members_announce() -> None:
    # a and b fetched the same state of L0-2 at step 5 (same bytes); x announces other bytes
    # and is even placed at the stage: two votes beat one
    held = {
        "a": steps("L0-2", 5) | steps("L2-4", 5),
        "b": steps("L0-2", 5),
        "x": {"L0-2": {5: d("crafted")}},
    }
    start = choose_start_step(NEEDED, held, {"L0-2": {"x"}, "L2-4": {"a"}}, ["x", "a", "b"])
    assert start.step == 5 and start.digests["L0-2"] == d("L0-2@5")
    assert replace(start, held=held).holders("L0-2", 5) == ["a", "b"]  # x is never asked


def test_the_stage_own_member_may_announce_a_newer_step_alone() -> None:
    # the last stage applied step 9 before the plan changed: its only trainer b holds it alone
    # while a spare c holds an old copy; b is placed at the stage, so its step counts
    held = {"a": steps("L0-2", 9, 10), "b": steps("L2-4", 9, 10), "c": steps("L2-4", 3)}
    start = choose_start_step(NEEDED, held, {"L0-2": {"a"}, "L2-4": {"b"}})
    assert start.step == 10
    # a member not placed at the stage cannot do the same
    start = choose_start_step(NEEDED, held, {"L0-2": {"a"}, "L2-4": {"c"}})
    assert start.step == 3 and start.note  # b's steps are not corroborated: c's old one is


SEED = bytes(range(32))
PEER = identity.peer_id_of(SEED)
OTHER_SEED = bytes(range(1, 33))


def test_a_signed_announcement_is_read_back() -> None:
    held = root(steps("L0-2", 1, 3))
    held["L2-4"] = {2: (d("x"), "0123456789abcdef-e4")}
    value = sign_announcement(SEED, KEY, PEER, held)
    assert check_announcement(value, KEY, PEER, 40) == held


def test_an_announcement_under_another_peers_id_is_refused() -> None:
    """Attack 4b: the data-plane DHT had no record validation, so anyone could announce under
    a member's id."""
    forged = sign_announcement(OTHER_SEED, KEY, PEER, root(steps("L0-2", 39)))
    assert check_announcement(forged, KEY, PEER, 40) is None
    # the member's own, replayed under another plan's key, or altered after signing
    value = sign_announcement(SEED, KEY, PEER, root(steps("L0-2", 3)))
    assert check_announcement(value, "p2ptrain_r_resume_t1_e4", PEER, 40) is None
    altered = dict(value, states={"L0-2": [[4, d("x"), ""]]})
    assert check_announcement(altered, KEY, PEER, 40) is None


def test_announcements_off_the_wire_are_checked() -> None:
    good = sign_announcement(SEED, KEY, PEER, root(steps("L0-2", 3)))
    for bad_states in (
        None,
        [1],
        {"L0-2": "3"},
        {"L0-2": [[True, d("x"), ""]]},
        {"L0-2": [[-1, d("x"), ""]]},
        {1: [[1, d("x"), ""]]},
        {"x" * 100: [[1, d("x"), ""]]},
        {"L0-2": [[1, "nothex", ""]]},
        {"L0-2": [[1]]},
        {"L0-2": [[1, d("x")]]},
        {"L0-2": [[1, d("x"), None]]},
        {"L0-2": [[1, d("x"), "not-a-tag"]]},
        {"L0-2": [[n, d("x"), ""] for n in range(1000)]},
    ):
        assert check_announcement(dict(good, states=bad_states), KEY, PEER, 40) is None
    for bad in (None, [1], dict(good, sig="text"), dict(good, peer=None), {**good, "sig": b""}):
        assert check_announcement(bad, KEY, PEER, 40) is None


def test_an_announcement_at_or_past_the_last_step_is_refused() -> None:
    """Attack 4: one member announcing every stage at the run's last step made every worker
    skip training and exit as if the run were done."""
    value = sign_announcement(SEED, KEY, PEER, root(steps("L0-2", 40) | steps("L2-4", 40)))
    assert check_announcement(value, KEY, PEER, 40) is None
    value = sign_announcement(SEED, KEY, PEER, root(steps("L0-2", 39)))
    assert check_announcement(value, KEY, PEER, 40) == root(steps("L0-2", 39))


def test_a_replica_cannot_push_a_step_its_stage_mates_do_not_hold() -> None:
    # a and x are both placed at L0-2; x alone claims step 6
    held = {"a": steps("L0-2", 4, 5), "x": steps("L0-2", 5, 6, tag="x"), "b": steps("L2-4", 5, 6)}
    start = choose_start_step(NEEDED, held, {"L0-2": {"a", "x"}, "L2-4": {"b"}}, ["a", "x", "b"])
    assert start.step == 5 and start.digests["L0-2"] == d("L0-2@5")  # a: first in the plan


# a plan that cuts the 4 layers anew: L0-3 and L3-4 were never saved (worker/resume/covers.py)
RECUT = ["L0-3", "L3-4"]


def test_a_new_cut_is_built_from_the_old_stages_at_their_newest_common_step() -> None:
    held = {"a": steps("L0-2", 8, 9), "b": steps("L2-4", 9, 10)}
    start = choose_start_step(RECUT, held, {"L0-3": {"b"}, "L3-4": {"a"}}, ["a", "b"])
    assert start.step == 9 and start.note == ""
    assert start.sources == {"L0-3": ("L0-2", "L2-4"), "L3-4": ("L2-4",)}
    assert start.digests == {"L0-2": d("L0-2@9"), "L2-4": d("L2-4@9")}
    assert replace(start, held=held).holders("L2-4", 9) == ["b"]


def test_a_stage_s_own_state_comes_before_a_cover_and_covers_take_the_fewest_pieces() -> None:
    both = steps("L0-2", 6) | steps("L2-4", 6)
    held = {"a": steps("L0-3", 5, 6), "b": both, "c": both}
    start = choose_start_step(RECUT, held, {"L0-3": {"a"}, "L3-4": {"b"}}, ["a", "b", "c"])
    assert start.step == 6 and start.sources == {"L3-4": ("L2-4",)}
    assert start.digests == {"L0-3": d("L0-3@6"), "L2-4": d("L2-4@6")}
    assert cover(range(0, 3), ["L0-1", "L1-3", "L0-2", "L2-4", "L00-3"]) == ("L0-2", "L2-4")
    assert cover(range(0, 3), ["L0-1", "L2-4"]) is None


def test_with_one_replica_a_cut_and_its_reverse_lose_nothing() -> None:
    # 2 stages of 2 layers until step 3, then of 3 and 1 until step 6; back to 2 and 2 now
    held = {
        "a": steps("L0-2", 3) | steps("L0-3", 5, 6),
        "b": steps("L2-4", 3) | steps("L3-4", 5, 6),
    }
    start = choose_start_step(NEEDED, held, {"L0-2": {"a"}, "L2-4": {"b"}}, ["a", "b"])
    assert start.step == 6 and start.note == ""
    assert start.sources == {"L0-2": ("L0-3",), "L2-4": ("L0-3", "L3-4")}


def test_a_cover_needs_every_block_and_the_model_s_ranges_only() -> None:
    held = {"a": steps("L0-1", 4) | steps("L2-4", 4), "b": steps("L1-2", 3) | steps("L3-9", 4)}
    start = choose_start_step(RECUT, held, {"L0-3": {"a"}, "L3-4": {"b"}})
    # block 1 only at step 3: L0-3 is not covered at 4, but built there from what holds its
    # other blocks, block 1 from initial weights (it used to start wholly fresh), and said
    assert start.step == 4 and start.sources.get("L0-3") == ("L0-1", "L2-4")
    assert start.fresh == {"L0-3": (1,)} and "block 1 of L0-3" in start.note
    assert start.sources.get("L3-4") == ("L2-4",)  # never from L3-9, past the last block


def test_a_member_cannot_push_newer_blocks_of_someone_else_s_stage_in_pieces() -> None:
    """Attack 4b with a new cut: x announced a newer step of every block, in ranges nobody else
    named, so that each piece had one announcer."""
    honest = {"a": steps("L0-2", 8, 9), "b": steps("L2-4", 8, 9)}
    crafted = {k: {10: d(f"crafted{k}")} for k in ("L0-1", "L1-3", "L3-4", "L2-3")}
    held = {**honest, "x": crafted}
    start = choose_start_step(RECUT, held, {"L0-3": {"a"}, "L3-4": {"b"}}, ["a", "b", "x"])
    assert start.step == 9 and set(start.digests) == {"L0-2", "L2-4"}
    # placed at L0-3, x has the last word on its blocks, as for any stage's own member, but
    # not on b's: the stages share no step, and no crafted state is agreed on
    start = choose_start_step(RECUT, held, {"L0-3": {"x"}, "L3-4": {"b"}}, ["a", "b", "x"])
    assert start.step == 9 and start.note and set(start.digests) == {"L2-4"}
    # the blocks' one holder may: the only voice about them is not contradicted
    start = choose_start_step(RECUT, {"x": crafted}, {"L0-3": {"a"}, "L3-4": {"b"}})
    assert start.step == 10


def test_a_donor_s_newer_state_outranks_the_older_one_its_taker_holds() -> None:
    """A stopping peer kept as the plan's donor (Plan.donors) holds its stage at 8-9; the peer
    placed there to take it over once held that stage at 5-6. Heard as a spare, the donor lost
    to the placed taker and the start took the taker's step 6: three steps of the stage lost."""
    held = {
        "a": steps("L0-2", 8, 9),
        "taker": steps("L2-4", 5, 6, tag="old"),
        "donor": steps("L2-4", 8, 9),
    }
    placed = {"L0-2": {"a"}, "L2-4": {"taker"}}
    before = choose_start_step(NEEDED, held, placed, ["a", "taker", "donor"])
    assert before.state_step("L2-4") == 6  # what a plain spare's word is worth
    donors = {"donor": range(2, 4)}  # the plan's word: the blocks it hands over
    start = choose_start_step(NEEDED, held, placed, ["a", "taker", "donor"], donors=donors)
    assert start.step == 9 and start.note == ""
    assert start.digests["L2-4"] == d("L2-4@9")  # the donor's: only it announced it


def test_a_donor_is_heard_first_on_the_blocks_it_hands_over_only() -> None:
    """A hostile stopping peer kept as a donor of L2-4 announces the whole model newer: heard
    first on every block, it would have replaced every stage's state."""
    held = {"a": steps("L0-2", 99, 100), "b": steps("L2-4", 99, 100), "donor": steps("L0-4", 150)}
    placed = {"L0-2": {"a"}, "L2-4": {"b"}}
    donors = {"donor": range(2, 4)}
    start = choose_start_step(NEEDED, held, placed, ["a", "b", "donor"], donors=donors)
    # L0-2 stays a's: the donor's word on blocks 0-1 counts for nothing; blocks 2-3 are its to
    # decide, as they were while it trained them alone (docs/security.md, 4b)
    assert start.step == 100 and start.digests["L0-2"] == d("L0-2@100")
    assert "L0-2" not in start.sources and d("L0-4@150") not in start.digests.values()
    without = choose_start_step(NEEDED, held, placed, ["a", "b", "donor"])
    assert without.step == 100 and without.digests == {"L0-2": d("L0-2@100"), "L2-4": d("L2-4@100")}


def test_a_partly_covered_stage_never_drags_the_start_back() -> None:
    """L4-6 is new and only an old L3-5 at step 40 holds any of it: it is built at the step the
    other stages start from (100) or not at all, never at 40, which made every stage go back."""
    held = {"a": steps("L0-2", 90, 100), "b": steps("L2-4", 90, 100), "d": steps("L3-5", 40)}
    needed = ["L0-2", "L2-4", "L4-6"]
    placed = {"L0-2": {"a"}, "L2-4": {"b"}, "L4-6": {"d"}}
    start = choose_start_step(needed, held, placed, ["a", "b", "d"])
    assert start.step == 100 and start.state_step("L0-2") == 100
    assert "L4-6" not in start.sources and "no saved state for L4-6" in start.note
    # held at the start's step, it builds the blocks it holds
    held["d"] = steps("L3-5", 40, 100)
    start = choose_start_step(needed, held, placed, ["a", "b", "d"])
    assert (
        start.step == 100 and start.sources["L4-6"] == ("L3-5",) and start.fresh == {"L4-6": (5,)}
    )


def test_a_donor_kept_after_its_taker_trained_on_rolls_nothing_back() -> None:
    """A later plan keeps the donor (re-issued before it said it left): its taker trained from
    its step 10 to 20, and the donor's 10 must not outrank that."""
    held = {"a": steps("L0-2", 19, 20), "taker": steps("L2-4", 19, 20), "donor": steps("L2-4", 10)}
    placed = {"L0-2": {"a"}, "L2-4": {"taker"}}
    order = ["a", "taker", "donor"]
    start = choose_start_step(NEEDED, held, placed, order, donors={"donor": range(2, 4)})
    assert start.step == 20 and start.note == "" and start.digests["L2-4"] == d("L2-4@20")


def test_members_silent_past_the_agreements_time_are_told_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member that never announces held every plan's start up (120 s, then the sessions
    failed) and stayed in every plan; its silence is now said, so the planner can judge it."""
    import sys
    from types import ModuleType, SimpleNamespace
    from typing import Any

    from p2ptrain.worker.resume.start_step import agree_on_start

    # the DHT's clock only: hivemind and libp2p cannot share a unit-test process
    fake = ModuleType("hivemind.utils")
    fake.get_dht_time = lambda: 0.0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hivemind", ModuleType("hivemind"))
    monkeypatch.setitem(sys.modules, "hivemind.utils", fake)

    class Dht:  # a DHT where only our own announcement is ever stored
        def __init__(self) -> None:
            self.values: dict[str, Any] = {}

        def store(self, key: str, value: bytes, expiry: float, subkey: str) -> None:
            self.values[subkey] = SimpleNamespace(value=value)

        def get(self, key: str, latest: bool) -> Any:
            return SimpleNamespace(value=dict(self.values))

    seed = bytes(range(32))
    me = identity.peer_id_of(seed)
    told: list[list[str]] = []
    start = agree_on_start(
        Dht(),  # type: ignore[arg-type]
        KEY,
        seed,
        me,
        [me, "12D3KooWSilentA", "12D3KooWSilentB"],
        {"L0-2": {me}},
        root(steps("L0-2", 4)),
        lambda tag: 0,  # every lineage's state ranks alike
        lambda: False,
        num_steps=100,
        timeout_s=0.0,  # the wait is over at its first look
        on_silent=told.append,
    )
    assert start is None
    assert told == [["12D3KooWSilentA", "12D3KooWSilentB"]]
