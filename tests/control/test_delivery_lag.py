"""A busy machine hears everyone late; the bound on a member's silence grows by that lag, so the
lag does not read as deaths (control/delivery_lag.py)."""

from __future__ import annotations

from p2ptrain.control.delivery_lag import LAG_WINDOW_S, MAX_EXTRA_S, DeliveryLag
from p2ptrain.control.membership import Member
from p2ptrain.control.view import DEAD_AFTER_S, SwarmView
from p2ptrain.records import PeerRecord


def test_the_median_lag_of_recent_authors_one_skewed_author_moves_nothing() -> None:
    lag = DeliveryLag()
    assert lag.extra_s(0.0) == 0.0
    for i, late_s in enumerate([12.0, 14.0, 15.0, 16.0]):
        lag.note(f"honest{i}", late_s, 10.0)
    lag.note("skewed-clock", 29.0, 10.0)  # one of five: the median moves to the next one
    lag.note("forged-old-stamp", 1e9, 10.0)  # older than gossip keeps: tells nothing
    assert lag.extra_s(10.0) == 15.0
    assert 0.0 < MAX_EXTRA_S <= 30.0


def test_authors_not_heard_lately_stop_counting() -> None:
    lag = DeliveryLag()
    lag.note("a", 20.0, 0.0)
    lag.note("b", 1.0, LAG_WINDOW_S)
    assert lag.extra_s(LAG_WINDOW_S + 5.0) == 1.0  # "a" was last heard more than a window ago


def test_a_member_heard_late_everywhere_is_not_called_dead() -> None:
    calm, busy = (
        SwarmView(self_id="me", role="control-only", planner_capable=True, started_at=0.0)
        for _ in range(2)
    )
    for view in (calm, busy):
        view.members["slow"] = _member(last_heard=100.0)
    for author in ("x", "y", "z"):  # everything reaches the busy node 10 s late now
        busy.members.delivery_lag.note(author, 10.0, 101.0)
    assert not calm.is_alive("slow", 100.0 + DEAD_AFTER_S + 5.0)
    assert busy.is_alive("slow", 100.0 + DEAD_AFTER_S + 5.0)
    assert not busy.is_alive("slow", 100.0 + DEAD_AFTER_S + 11.0)


def _member(last_heard: float) -> Member:
    record = PeerRecord(
        addrs=(), role="control-only", planner_capable=True, version="0", hardware={}
    )
    return Member(record=record, last_heard=last_heard)
