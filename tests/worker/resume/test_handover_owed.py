"""A spare's part in a hand-over (worker/resume/handover.py): which fetches it waits for, and the
wait itself."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from p2ptrain.records import Plan
from p2ptrain.worker.resume import restore
from p2ptrain.worker.resume.handover import Served, owed
from p2ptrain.worker.resume.start_choice import choose_start_step, placement

N_LAYER = 4


def plan(pipelines: list[list[str]], spares: tuple[str, ...]) -> Plan:
    return Plan(
        term=1,
        epoch=2,
        planner="a",
        stages=len(pipelines[0]),
        pipelines=tuple(tuple(p) for p in pipelines),
        spares=spares,
        data_addrs={},
        cost_s=1.0,
    )


def test_a_donor_owes_its_stage_to_the_peer_now_placed_there_and_to_no_one_else() -> None:
    # the next plan: a keeps stage 0, s takes stage 1, which only the leaving d (a spare) holds
    new = plan([["a", "s"]], spares=("d",))
    _, placed = placement(new, N_LAYER)
    held = {"a": {"L0-2": {7: "aa"}}, "s": {}, "d": {"L2-4": {7: "dd"}}}
    start = choose_start_step(list(placed), held, placed, ["a", "s", "d"])
    start = replace(start, held=held)  # as choose_start fills it in
    assert start.step == 7 and start.digests == {"L0-2": "aa", "L2-4": "dd"}
    assert owed(start, new, "d", N_LAYER) == {("s", "dd")}
    assert owed(start, new, "a", N_LAYER) == set()  # a holds stage 0 and trains it itself


def test_of_two_donors_holding_one_state_the_first_its_fetcher_asks_waits() -> None:
    new = plan([["a", "s"]], spares=("d", "e"))
    _, placed = placement(new, N_LAYER)
    held = {"a": {"L0-2": {7: "aa"}}, "s": {}, "d": {"L2-4": {7: "dd"}}, "e": {"L2-4": {7: "dd"}}}
    start = choose_start_step(list(placed), held, placed, ["a", "s", "d", "e"])
    start = replace(start, held=held)  # as choose_start fills it in
    assert owed(start, new, "d", N_LAYER) == {("s", "dd")}  # s asks d first (holders sorted)
    assert owed(start, new, "e", N_LAYER) == set()


def test_a_state_the_placed_peer_holds_itself_is_owed_by_nobody() -> None:
    new = plan([["a", "s"]], spares=("d",))
    _, placed = placement(new, N_LAYER)
    held = {"a": {"L0-2": {7: "aa"}}, "s": {"L2-4": {7: "dd"}}, "d": {"L2-4": {7: "dd"}}}
    start = replace(choose_start_step(list(placed), held, placed, ["a", "s", "d"]), held=held)
    assert owed(start, new, "d", N_LAYER) == set()


def test_the_wait_ends_when_every_owed_state_was_sent() -> None:
    served = Served()
    needed = {("s", "dd"), ("t", "dd")}
    threading.Timer(0.05, served.add, ("s", "dd")).start()
    threading.Timer(0.10, served.add, ("x", "dd")).start()  # not owed: changes nothing
    threading.Timer(0.15, served.add, ("t", "dd")).start()
    started = time.monotonic()
    assert served.wait_for(needed, 5.0, lambda: False)
    assert time.monotonic() - started < 2.0


def test_the_wait_gives_up_at_its_bound_or_when_the_worker_stops() -> None:
    served = Served()
    assert not served.wait_for({("s", "dd")}, 0.05, lambda: False)
    started = time.monotonic()
    assert not served.wait_for({("s", "dd")}, 30.0, lambda: True)
    assert time.monotonic() - started < 1.0


class _Peer:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id


def test_the_taker_tells_the_donor_it_waits_for_that_it_holds_the_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The donor owes s its stage (above) and waits up to the hand-over's limit for s to fetch
    it; s restored it (fetched, or from a file of its own: a spare's copy) and tells it, so the
    donor stops at once; nobody else tells anyone."""
    new = plan([["a", "s"]], spares=("d",))
    _, placed = placement(new, N_LAYER)
    held = {"a": {"L0-2": {7: "aa"}}, "s": {}, "d": {"L2-4": {7: "dd"}}}
    start = replace(choose_start_step(list(placed), held, placed, ["a", "s", "d"]), held=held)
    told: list[tuple[str, str, list[tuple[range, int, str]]]] = []
    monkeypatch.setattr(
        restore, "tell_held", lambda t, peer, states: told.append((t.peer_id, peer, states))
    )
    restore.release_donors(new, _Peer("s"), start, ("L2-4",))  # type: ignore[arg-type]
    assert told == [("s", "d", [(range(2, 4), 7, "dd")])]
    restore.release_donors(new, _Peer("a"), start, ("L0-2",))  # type: ignore[arg-type]
    as_placed = plan([["a", "s"], ["d", "t"]], spares=())  # d placed, not a donor: never waits
    restore.release_donors(as_placed, _Peer("s"), start, ("L2-4",))  # type: ignore[arg-type]
    assert len(told) == 1
