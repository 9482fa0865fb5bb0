"""The outer round's pacer (worker/averaging/round_pacing.py) on fake clocks: a piece of work is
stretched to span its CPU at the allowed rate, sends are spaced, and nothing waits past the
window's end."""

from __future__ import annotations

import pytest

from p2ptrain.worker.averaging import round_inbox
from p2ptrain.worker.averaging.round_inbox import RoundStopped
from p2ptrain.worker.averaging.round_pacing import RoundPacer


class Clocks:
    """Wall and CPU clocks the test moves; sleeping moves the wall clock only."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wall, self.cpu = 100.0, 5.0
        self.slept: list[float] = []
        monkeypatch.setattr(round_inbox.time, "monotonic", lambda: self.wall)
        monkeypatch.setattr(round_inbox.time, "sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.wall += seconds

    def pacer(self, window_s: float, gap_s: float, cpu_rate: float) -> RoundPacer:
        return RoundPacer(
            window_s, gap_s, cpu_rate, lambda: False, lambda: self.wall, lambda: self.cpu
        )


def test_a_piece_of_work_spans_its_cpu_at_the_allowed_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    clocks = Clocks(monkeypatch)
    pacer = clocks.pacer(window_s=10.0, gap_s=0.0, cpu_rate=0.05)
    start = clocks.wall
    with pacer.work():  # 0.02 s of CPU in 0.1 s of wall: at 0.05 CPU-s/s it must span 0.4 s
        clocks.cpu += 0.02
        clocks.wall += 0.1
    assert clocks.wall - start == pytest.approx(0.4)


def test_pauses_stop_at_the_window_and_no_rate_means_no_cpu_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clocks = Clocks(monkeypatch)
    pacer = clocks.pacer(window_s=1.0, gap_s=0.3, cpu_rate=0.01)
    start = clocks.wall
    pacer.between_sends()
    assert clocks.wall - start == pytest.approx(0.3)
    with pacer.work():  # would span 5 s: cut at the window's end
        clocks.cpu += 0.05
    assert clocks.wall - start == pytest.approx(1.0)
    pacer.between_sends()  # past the window: at once
    assert clocks.wall - start == pytest.approx(1.0)
    free = clocks.pacer(window_s=10.0, gap_s=0.0, cpu_rate=0.0)
    before = clocks.wall
    with free.work():
        clocks.cpu += 1.0
    assert clocks.wall == before


def test_a_paced_pause_notices_the_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    clocks = Clocks(monkeypatch)
    stop = {"now": False}
    pacer = RoundPacer(10.0, 5.0, 0.0, lambda: stop["now"], lambda: clocks.wall)

    def sleep(seconds: float) -> None:
        clocks.sleep(seconds)
        stop["now"] = True

    monkeypatch.setattr(round_inbox.time, "sleep", sleep)
    with pytest.raises(RoundStopped):
        pacer.between_sends()
    assert clocks.wall - 100.0 < 1.0
