"""Members silent in a plan's start agreement (control/planning/silent_start.py): one that never
announced held every plan's start up, and the planner kept it in every plan; now a strict
majority of the plan's other members (two at least) naming it under that plan leaves it out of
the next plans for a while, and a lone or minority accuser, or another plan's reports, do not."""

from __future__ import annotations

import pytest

from p2ptrain.control.planning.silent_start import (
    FORGIVE_S,
    JUDGE_AFTER_S,
    MAX_OUT_S,
    SILENT_OUT_S,
    SilentStart,
)
from p2ptrain.records import PeerMetrics, Plan

PEERS = ["p0", "p1", "p2", "p3", "p4"]


def plan(epoch: int = 1, peers: list[str] = PEERS) -> Plan:
    return Plan(
        term=1,
        epoch=epoch,
        planner="p0",
        stages=1,
        pipelines=tuple((p,) for p in peers[:-1]),
        spares=(peers[-1],),  # a spare announces too: it may be the silent one
        data_addrs={},
        cost_s=1.0,
    )


def said(silent: dict[str, tuple[str, ...]], key: tuple[int, int] = (1, 1)) -> dict:
    return {p: PeerMetrics(silent=s, silent_plan=key) for p, s in silent.items()}


def judged(judge: SilentStart, p: Plan, reports: dict, now: float) -> list[str]:
    """What the planner plans once the plan's reports are in: the first look starts the
    wait, the look JUDGE_AFTER_S later judges them."""
    judge.admit(p, PEERS, reports, now)
    return judge.admit(p, PEERS, reports, now + JUDGE_AFTER_S)


def test_a_member_most_others_never_heard_is_left_out_then_planned_again() -> None:
    judge = SilentStart()
    reports = said({p: ("p4",) for p in ("p0", "p1", "p2")})  # 3 of its 4 mates
    assert judge.admit(plan(), PEERS, reports, now=0.0) == PEERS  # the rest may come in yet
    assert judged(judge, plan(), reports, now=0.0) == PEERS[:4]
    end = JUDGE_AFTER_S + SILENT_OUT_S
    assert judge.admit(plan(), PEERS, reports, now=end - 1) == PEERS[:4]  # judged once
    assert judge.admit(plan(2), PEERS, {}, now=end) == PEERS  # its time is up
    # silent again under later plans: out twice as long each time, at most MAX_OUT_S
    now = end
    for n, epoch in enumerate((3, 4, 5, 6), start=2):
        now += MAX_OUT_S + 1  # its last time is up, and it is not yet forgiven
        judged(judge, plan(epoch), said({p: ("p4",) for p in PEERS[:3]}, (1, epoch)), now)
        assert judge.until["p4"] - now - JUDGE_AFTER_S == min(
            MAX_OUT_S, SILENT_OUT_S * 2 ** (n - 1)
        )
    # silent once more long after: as the first time
    now += MAX_OUT_S + FORGIVE_S
    judged(judge, plan(7), said({p: ("p4",) for p in PEERS[:3]}, (1, 7)), now)
    assert judge.until["p4"] - now - JUDGE_AFTER_S == SILENT_OUT_S


def test_a_plan_all_of_whose_peers_reported_is_judged_at_once() -> None:
    reports = said({p: ("p4",) for p in PEERS[:4]} | {"p4": ("p0",)})
    assert SilentStart().admit(plan(), PEERS, reports, now=0.0) == PEERS[:4]


def test_reports_coming_in_a_tick_apart_are_judged_together() -> None:
    """Judged on the first three of five that all named each other, two were left out before
    the other two reports came in (the guard against leaving under half the plan too late)."""
    judge = SilentStart()
    everyone = {p: tuple(q for q in PEERS if q != p) for p in PEERS}
    for n in range(1, len(PEERS) + 1):
        first = said({p: everyone[p] for p in PEERS[:n]})
        assert judge.admit(plan(), PEERS, first, now=float(n)) == PEERS


def test_when_everyone_names_everyone_no_one_is_singled_out() -> None:
    """A data-plane DHT that fails for all: leaving them all out would plan nobody."""
    reports = said({p: tuple(q for q in PEERS if q != p) for p in PEERS})
    assert SilentStart().admit(plan(), PEERS, reports, now=0.0) == PEERS


def test_a_splits_larger_side_goes_on_without_the_smaller() -> None:
    left, right = PEERS[:3], PEERS[3:]
    reports = said({p: tuple(right) for p in left} | {p: tuple(left) for p in right})
    assert SilentStart().admit(plan(), PEERS, reports, now=0.0) == left  # all reported


@pytest.mark.parametrize(
    "silent",
    [
        {"p0": ("p4",)},  # a lone accuser
        {"p0": ("p4",), "p1": ("p4",)},  # two of its four mates: no strict majority
        {"p4": ("p0", "p1", "p2", "p3")},  # the silent one naming everyone
        {"p0": ("p0",), "p1": ("p0",)},  # one naming itself counts for nothing
    ],
)
def test_a_minority_of_accusers_leaves_nobody_out(silent: dict[str, tuple[str, ...]]) -> None:
    assert judged(SilentStart(), plan(), said(silent), now=0.0) == PEERS


def test_only_the_current_plans_reports_count_and_only_its_members_accuse() -> None:
    judge = SilentStart()
    stale = said({p: ("p4",) for p in ("p0", "p1", "p2")}, key=(1, 0))
    assert judged(judge, plan(), stale, now=0.0) == PEERS
    strangers = {f"s{i}": PeerMetrics(silent=("p4",), silent_plan=(1, 1)) for i in range(9)}
    assert judged(judge, plan(), strangers, now=0.0) == PEERS


def test_in_a_plan_of_two_nobody_can_tell_who_is_silent() -> None:
    two = plan(peers=["p0", "p1"])
    reports = said({"p0": ("p1",), "p1": ("p0",)})
    assert SilentStart().admit(two, ["p0", "p1"], reports, now=0.0) == ["p0", "p1"]
