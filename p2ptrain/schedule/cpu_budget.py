"""A machine's CPU under a quota, for the step simulation (schedule/step_sim.py).

A volunteer's machine, or a testbed peer held to a share of a core, runs a step's pieces (the
passes, the frames' and the averaging round's local work) one CPU budget deep. Pure Python.
"""

from __future__ import annotations

import math


class CpuBudget:
    """One machine's CPU under a quota, as Linux's CFS bandwidth control runs it: work goes at
    full speed while the period's slice lasts, then waits for the next period (no carry-over).
    So a short burst after an idle wait costs its CPU seconds, and long work costs CPU / cores:
    the two ends that a single rate gets wrong (docs/scheduler.md, "The whole step, simulated").
    The periods start at time 0; work must be run in time order. No quota: work costs its CPU
    seconds."""

    def __init__(self, cores: float | None = None, period_s: float = 0.1) -> None:
        if cores is not None and not (cores > 0 and period_s > 0):
            raise ValueError(f"a quota needs cores > 0 and a period > 0, got {cores}, {period_s}")
        self.slice_s = None if cores is None else cores * period_s
        self.period_s = period_s
        self._period = -1
        self._left = 0.0

    def run(self, start: float, cpu_s: float) -> float:
        """When work of `cpu_s` CPU seconds that may start at `start` is done."""
        if self.slice_s is None or cpu_s <= 0:
            return start + max(cpu_s, 0.0)
        period = math.floor(start / self.period_s + 1e-9)  # at a boundary: the next one
        if period != self._period:  # a new period: a fresh slice
            self._period, self._left = period, self.slice_s
        now = min(start + min(cpu_s, self._left), (period + 1) * self.period_s)
        todo, self._left = cpu_s - (now - start), self._left - (now - start)
        if todo <= 1e-12:
            return now
        # the rest from the next period on, a whole slice each until the last
        periods = max(1, math.ceil(todo / self.slice_s - 1e-9))
        used = todo - (periods - 1) * self.slice_s
        self._period, self._left = period + periods, self.slice_s - used
        return (period + periods) * self.period_s + used
