"""How an outer round spreads its work over the steps before its result is due.

On a worker with a small CPU quota (bench scaleout: 1/8 of a core) every CPU second the round's
thread, the transport and p2pd spend comes out of the passes' quota, and a step's wall time is
the worker's CPU over that quota: a round's work done at once stretched the step it landed in
1.6-2x. The pacer spaces the round's sends evenly (the transport's and p2pd's CPU follows the
bytes) and holds the round thread's own CPU to a share of the rate the passes use: each piece of
work is followed by a pause that makes it span its CPU time at that rate. No pause runs past the
round's pacing deadline, so the round's timeouts stay the plan's; after it, the work goes at once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from p2ptrain.worker.averaging.round_inbox import wait_or_stop

# the round thread's CPU rate, at most this share of the passes' CPU rate (what is left of a
# step's 1.5x bound goes to the transport and p2pd carrying the round's bytes)
ROUND_CPU_SHARE = 0.2


class RoundPacer:
    def __init__(
        self,
        window_s: float,
        send_gap_s: float,
        cpu_rate: float,
        should_stop: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        """window_s: how long from now pauses may run; send_gap_s: between two sends;
        cpu_rate: the CPU seconds a second of wall time the round's thread may use (0: no
        CPU pacing)."""
        self.window_s = max(0.0, window_s)
        self.deadline = clock() + self.window_s
        self.send_gap_s = send_gap_s
        self.cpu_rate = cpu_rate
        self.should_stop = should_stop
        self._clock, self._cpu_clock = clock, cpu_clock

    @classmethod
    def at_once(cls, should_stop: Callable[[], bool]) -> RoundPacer:
        """No pauses (a retry among the members heard from goes at once)."""
        return cls(0.0, 0.0, 0.0, should_stop)

    def pause(self, seconds: float) -> None:
        """Sleep `seconds`, cut at the deadline; RoundStopped once should_stop()."""
        wait_or_stop(min(seconds, self.deadline - self._clock()), self.should_stop)

    def between_sends(self) -> None:
        self.pause(self.send_gap_s)

    @contextlib.contextmanager
    def work(self) -> Iterator[None]:
        """A piece of the round's CPU work: afterwards, a pause so that it spans its CPU
        time at cpu_rate (a piece of 0.03 s of CPU at 0.03 CPU-s/s: one second in all)."""
        started, cpu = self._clock(), self._cpu_clock()
        yield
        if self.cpu_rate > 0:
            used = self._cpu_clock() - cpu
            self.pause(used / self.cpu_rate - (self._clock() - started))
