"""Our own stalls are not the members' deaths (control/loop_stall.py): a node that got no CPU
for seconds widens every member's allowed silence by that stall, also before its heartbeat
has run again, and forgets it a minute later."""

from __future__ import annotations

import pytest

from p2ptrain.control.loop_stall import MAX_EXTRA_S, STALL_WINDOW_S, TICK_S, LoopStall
from p2ptrain.control.membership import DEAD_AFTER_S, Member, Membership
from p2ptrain.records import PeerRecord


def _beats(stall: LoopStall, start: float, count: int) -> float:
    now = start
    for _ in range(count):
        stall.beat(now)
        now += TICK_S
    return now - TICK_S


def test_punctual_beats_add_nothing() -> None:
    stall = LoopStall()
    assert stall.extra_s(0.0) == 0.0
    last = _beats(stall, 0.0, 20)
    assert stall.extra_s(last) == 0.0
    assert stall.beat(last + TICK_S + 0.1) == 0.0  # ordinary scheduling jitter
    assert stall.extra_s(last + TICK_S + 0.1) == 0.0


def test_a_stall_counts_while_in_progress_and_for_a_window_after() -> None:
    stall = LoopStall()
    last = _beats(stall, 0.0, 4)
    # the loop stood still 12 s: a check that runs before the heartbeat already sees it
    resumed = last + TICK_S + 12.0
    assert stall.extra_s(resumed) == pytest.approx(12.0)
    assert stall.beat(resumed) == pytest.approx(12.0)  # the heartbeat logs what it ended
    assert stall.extra_s(resumed + 1.0) == pytest.approx(12.0)  # remembered after the beat
    later = _beats(stall, resumed + TICK_S, int(STALL_WINDOW_S / TICK_S) + 4)
    assert stall.extra_s(later) == 0.0  # forgotten a window later


def test_a_stall_widens_liveness_by_at_most_max_extra() -> None:
    stall = LoopStall()
    stall.beat(0.0)
    assert stall.extra_s(1000.0) == MAX_EXTRA_S


def test_a_member_heard_just_before_our_stall_stays_alive() -> None:
    members = Membership()
    members["peer"] = Member(PeerRecord((), "control-only", True, "0", {}), last_heard=0.0)
    last = _beats(members.loop_stall, 0.0, 3)
    resumed = last + TICK_S + 15.0  # no CPU for 15 s: every member looks silent
    assert resumed > DEAD_AFTER_S
    assert members.heard_lately("peer", resumed)
    # while we run again, a member silent for longer than the bound plus our stall is dead
    later = _beats(members.loop_stall, resumed, 20)
    assert later > DEAD_AFTER_S + 15.0
    assert not members.heard_lately("peer", later)
